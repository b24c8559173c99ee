"""Write the golden vectors: the frames vLLM 0.33.0 itself writes for every case.

Usage::

    python scripts/make_golden_vectors.py            # (re)write conformance/data/golden/*.json
    python scripts/make_golden_vectors.py --check    # compare the committed files, write nothing

The cases live in :func:`enginewire.conformance.oracle.golden.cases`; the frames come from vLLM's
own encoders (``MsgpackEncoder``, ``msgspec.msgpack.encode`` where vLLM uses it, the DP
coordinator's ``_send_start_wave``), and each vector records the neutral value of the object
vLLM encoded. The test suite then checks, without vLLM, that the reference codec writes the
same bytes from that value (``tests/test_codec_golden.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import version
from pathlib import Path

from enginewire.conformance.oracle.golden import (
    GOLDEN_DIR,
    GoldenVector,
    as_sent,
    cases,
    vector_to_json,
    vllm_frames,
    write_vector,
)
from enginewire.spec import REFERENCE_VLLM_VERSION


def make_vectors() -> list[GoldenVector]:
    vectors = []
    for case in cases():
        frames, encoded = vllm_frames(case.kind, case.value, case.threshold)
        vectors.append(
            GoldenVector(
                name=case.name,
                kind=case.kind,
                threshold=case.threshold,
                description=case.description,
                vllm_version=version("vllm"),
                value=as_sent(encoded) if encoded is not None else case.value,
                frames=tuple(frames),
            )
        )
    return vectors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=GOLDEN_DIR, help="directory to write")
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    installed = version("vllm")
    if installed != REFERENCE_VLLM_VERSION:
        print(f"vllm {installed} is installed; the vectors are for {REFERENCE_VLLM_VERSION}",
              file=sys.stderr)
        return 2
    vectors = make_vectors()
    if args.check:
        stale = []
        for vector in vectors:
            path = args.out / f"{vector.name}.json"
            if not path.exists() or json.loads(path.read_text()) != vector_to_json(vector):
                stale.append(path.name)
        known = {f"{v.name}.json" for v in vectors}
        extra = sorted(p.name for p in args.out.glob("*.json") if p.name not in known)
        for name in stale:
            print(f"differs or missing: {name}")
        for name in extra:
            print(f"no case makes: {name}")
        return 1 if stale or extra else 0
    for vector in vectors:
        print(write_vector(vector, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
