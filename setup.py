"""The one compiled piece of enginewire: the flag section of the ring's express path.

Everything else is in pyproject.toml. The extension is optional: where it cannot be built (no
C compiler, no Python headers) the install goes on and the ring runs the same section in Python
(reference/ring/express.py, python_flag_section).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("enginewire.reference.ring._express_flags",
                             ["reference/ring/_express_flags.c"], optional=True)])
