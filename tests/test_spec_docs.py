"""The Markdown pages rendered from the spec (``enginewire spec docs``)."""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import msgspec
import pytest

from enginewire.spec import Spec, load
from enginewire.spec.history.docs import history_pages as render_history
from enginewire.spec.loader import DATA_DIR
from enginewire.spec.render import GENERATED_MARK, render_pages, run_docs
from enginewire.spec.schema import SURFACE_SCHEMAS, RingFile, RingState, StateMachine

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "spec"
PAGES = {"index.md", "history.md", "breaks.md", *(f"{surface}.md" for surface in SURFACE_SCHEMAS)}

#: vLLM's ring layout (shm_broadcast.py:334-342), spelled as the layout table spells formulas.
VLLM_LAYOUT = {
    "metadata_size": "1 + n_reader",
    "data_offset": "0",
    "metadata_offset": "max_chunks * max_chunk_bytes",
    "total_bytes": "max_chunks * (max_chunk_bytes + metadata_size)",
    "chunk_offset": "data_offset + chunk * max_chunk_bytes",
    "chunk_metadata_offset": "metadata_offset + chunk * metadata_size",
    "written_flag": "chunk_metadata_offset",
    "read_flag": "chunk_metadata_offset + 1 + reader",
}
#: vLLM's four slot states (shm_broadcast.py:309-314).
VLLM_STATES = [
    RingState(name="empty", pattern="0???...???", can_read="no", can_write=True,
              description="not written"),
    RingState(name="written", pattern="1000...000", can_read="yes", can_write=False,
              description="just written"),
    RingState(name="partly-read", pattern="1???...???", can_read="if own flag is 0",
              can_write=False, description="read by some"),
    RingState(name="read", pattern="1111...111", can_read="no", can_write=True,
              description="read by all"),
]


@pytest.fixture(scope="module")
def history_once() -> dict[str, str]:
    """The history pages (history.md, breaks.md), rendered once for the module: every
    release's spec is loaded for them, most of a render's time, and they are a function of the
    committed data alone (``history_pages`` reads DATA_DIR, whatever the spec rendered)."""
    return render_history(GENERATED_MARK)


@pytest.fixture(autouse=True)
def _history_rendered_once(history_once: dict[str, str],
                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Every render in this module reuses :func:`history_once`'s pages (copies);
    test_rendering_is_deterministic_and_location_free renders them afresh, twice."""
    from enginewire.spec.history import docs

    monkeypatch.setattr(docs, "history_pages", lambda mark: dict(history_once)
                        if mark == GENERATED_MARK else render_history(mark))


def with_ring(spec: Spec, **changes: object) -> Spec:
    ring = msgspec.structs.replace(spec.surfaces["ring"], **changes)
    return dataclasses.replace(spec, surfaces={**spec.surfaces, "ring": ring})


def section(page: str, heading: str) -> str:
    """The text of one ``##``/``###`` section of a page."""
    start = page.index(heading)
    following = re.search(r"^#{2,3} ", page[start + len(heading):], flags=re.M)
    return page[start:start + len(heading) + following.start()] if following else page[start:]


def drawing(page: str) -> list[str]:
    match = re.search(r"```text\n(.*?)```", page, flags=re.S)
    assert match, "the ring page has no layout drawing"
    return match.group(1).splitlines()


# --- committed pages ---------------------------------------------------------------------


def test_committed_pages_are_fresh(capsys: pytest.CaptureFixture[str]) -> None:
    status = run_docs(load(), out=DOCS, check=True)
    stale = capsys.readouterr().err
    assert status == 0, (
        f"the pages under docs/spec do not match the spec: {stale.strip()} -- "
        "regenerate them with `enginewire spec docs` and commit the result"
    )


def test_modified_spec_makes_check_fail(tmp_path: Path, capsys) -> None:
    out = tmp_path / "docs"
    assert run_docs(load(), out=out, check=False) == 0
    assert run_docs(load(), out=out, check=True) == 0
    data = tmp_path / "data"
    shutil.copytree(DATA_DIR, data)
    identity = data / "identity.toml"
    identity.write_text(identity.read_text().replace(
        "An engine identity is exactly 2 bytes long.",
        "An engine identity is exactly 2 bytes long, always.",
    ))
    capsys.readouterr()
    assert run_docs(load(data_dir=data), out=out, check=True) == 1
    err = capsys.readouterr().err
    assert str(out / "identity.md") in err
    assert str(out / "index.md") in err
    assert str(out / "ring.md") not in err
    assert "enginewire spec docs" in err


def test_check_names_missing_and_leftover_pages(tmp_path: Path, capsys) -> None:
    out = tmp_path / "docs"
    run_docs(load(), out=out, check=False)
    (out / "ring.md").unlink()
    (out / "old-surface.md").write_text(GENERATED_MARK + "\n\n# gone\n")
    (out / "notes.md").write_text("# written by hand, not ours\n")
    capsys.readouterr()
    assert run_docs(load(), out=out, check=True) == 1
    err = capsys.readouterr().err
    assert str(out / "ring.md") in err
    assert str(out / "old-surface.md") in err
    assert "notes.md" not in err
    # Writing repairs both, and leaves the hand-written page alone.
    assert run_docs(load(), out=out, check=False) == 0
    assert not (out / "old-surface.md").exists()
    assert (out / "notes.md").exists()
    assert run_docs(load(), out=out, check=True) == 0


def test_cli_docs_and_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The command's wiring, in process (``python -m enginewire`` itself is run elsewhere)."""
    from enginewire.cli import main

    out = tmp_path / "docs"
    command = ["spec", "docs", "--out", str(out)]
    assert main([*command, "--check"]) == 1
    assert "stale pages" in capsys.readouterr().err
    assert main(command) == 0, capsys.readouterr().err
    assert {p.name for p in out.iterdir()} == PAGES
    assert main([*command, "--check"]) == 0, capsys.readouterr().err


# --- what the pages hold -------------------------------------------------------------------


def test_rendering_is_deterministic_and_location_free(tmp_path: Path,
                                                     history_once: dict[str, str]) -> None:
    data = tmp_path / "data"
    shutil.copytree(DATA_DIR, data)
    pages = render_pages(load())
    assert set(pages) == PAGES
    assert render_pages(load()) == pages
    assert render_pages(load(data_dir=data)) == pages
    # The history pages the module's other tests reuse: rendered afresh, twice, the same.
    fresh = render_history(GENERATED_MARK)
    assert fresh == render_history(GENERATED_MARK) == history_once
    assert {name: pages[name] for name in fresh} == fresh
    for name, text in pages.items():
        assert text.startswith(GENERATED_MARK + "\n"), name
        assert text.endswith("\n") and not text.endswith("\n\n"), name
        assert str(tmp_path) not in text and str(REPO) not in text, name


def test_every_clause_is_an_anchor_on_its_page_and_in_the_index() -> None:
    spec = load()
    pages = render_pages(spec)
    for clause_id, ref in spec.clauses.items():
        page = pages[f"{ref.surface}.md"]
        assert page.count(f'<a id="{clause_id}"></a>') == 1, clause_id
        anchor_at = page.index(f'<a id="{clause_id}"></a>')
        block = page[anchor_at:anchor_at + 4000]
        assert f"**{ref.clause.level}**" in block
        assert ref.clause.source.split(", ")[0] in block
        assert f"({ref.surface}.md#{clause_id})" in pages["index.md"], clause_id


def test_index_counts_clauses_by_surface_and_level() -> None:
    spec = load()
    index = render_pages(spec)["index.md"]
    for name, surface in spec.surfaces.items():
        levels = [sum(c.level == level for c in surface.clauses) for level in ("MUST", "SHOULD",
                                                                                 "MAY")]
        row = f"| [{name}]({name}.md) |"
        line = next(line for line in index.splitlines() if line.startswith(row))
        assert line.endswith(
            " | ".join(str(n) for n in levels) + f" | {len(surface.clauses)} |"
        ), line
    for level in ("MUST", "SHOULD", "MAY"):
        count = sum(ref.clause.level == level for ref in spec.clauses.values())
        assert f"### {level} ({count})" in index


def test_clause_block_shows_rationale_and_deviation() -> None:
    spec = load()
    page = render_pages(spec)["request_types.md"]
    clause = spec.clause("request_types.sentinels-never-on-wire")
    block = section(page, "### `request_types.sentinels-never-on-wire`")
    assert clause.text in block
    assert f"vLLM 0.33.0 deviates: {clause.vllm_deviation}" in block
    assert (
        "(https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/engine/__init__.py#L309-L312)"
        in block
    )
    rationale = spec.clause("identity.little-endian-rank").rationale
    assert f"Rationale: {rationale}" in render_pages(spec)["identity.md"]


def test_tables_escape_pipes() -> None:
    spec = load()
    for name, text in render_pages(spec).items():
        for line in text.splitlines():
            if line.startswith("| ") and "`" in line:
                cells = re.split(r"(?<!\\)\|", line)[1:-1]
                header = text.splitlines()[text.splitlines().index(line) - 1]
                assert all(cell.count("`") % 2 == 0 for cell in cells), (name, line, header)


def test_struct_tables_list_fields_in_wire_order() -> None:
    spec = load()
    page = render_pages(spec)["structs.md"]
    for name, found in spec.structs.items():
        assert f'<a id="{name}"></a>' in page
        fields = getattr(found, "fields", None)
        if not fields:
            continue
        block = section(page, f"### {name}\n")
        rows = [line for line in block.splitlines() if re.match(r"\| \d+ \| `", line)]
        assert [row.split(" | ")[1].strip("`") for row in rows] == [f.name for f in fields]
        assert f"Encoding: `{found.encoding}`" in block
        assert found.vllm_class in block


def test_handshake_machines_become_mermaid_diagrams() -> None:
    spec = load()
    handshake = spec.surfaces["handshake"]
    page = render_pages(spec)["handshake.md"]
    diagrams = re.findall(r"```mermaid\n(.*?)```", page, flags=re.S)
    assert len(diagrams) == len(handshake.machines)
    for machine, diagram in zip(handshake.machines, diagrams, strict=True):
        check_machine_diagram(machine, diagram)


def check_machine_diagram(machine: StateMachine, diagram: str) -> None:
    lines = diagram.splitlines()
    assert lines[0] == "stateDiagram-v2"
    ids = {}
    for line in lines:
        match = re.fullmatch(r'    state "(.*)" as (s\d+)', line)
        if match:
            ids[match.group(1)] = match.group(2)
    assert set(ids) == {state.name for state in machine.states}
    assert f"    [*] --> {ids[machine.initial]}" in lines
    arrows: dict[tuple[str, str], set[str]] = {}
    for line in lines:
        match = re.fullmatch(r"    (s\d+) --> (s\d+) : (.*)", line)
        if match:
            arrows[(match.group(1), match.group(2))] = set(match.group(3).split(", "))
    expected: dict[tuple[str, str], set[str]] = {}
    for transition in machine.transitions:
        pair = (ids[transition.source], ids[transition.target])
        expected.setdefault(pair, set()).add(transition.event)
    assert arrows == expected


def test_machine_diagram_from_a_made_up_machine() -> None:
    spec = load()
    machine = msgspec.convert(
        {
            "role": "probe",
            "initial": "A",
            "states": [{"name": n, "description": n} for n in ("A", "B: the second", "end")],
            "transitions": [
                {"source": "A", "event": "go", "target": "B: the second"},
                {"source": "A", "event": "skip", "target": "B: the second"},
                {"source": "B: the second", "event": "stop", "target": "end", "action": "x"},
            ],
            "illegal_event_clause": "identity.width-two-bytes",
        },
        StateMachine,
    )
    handshake = msgspec.structs.replace(spec.surfaces["handshake"], machines=[machine])
    probe = dataclasses.replace(spec, surfaces={**spec.surfaces, "handshake": handshake})
    page = render_pages(probe)["handshake.md"]
    diagram = re.findall(r"```mermaid\n(.*?)```", page, flags=re.S)[0]
    assert diagram.splitlines() == [
        "stateDiagram-v2",
        '    state "A" as s0',
        '    state "B - the second" as s1',
        '    state "end" as s2',
        "    [*] --> s0",
        "    s0 --> s1 : go, skip",
        "    s1 --> s2 : stop",
    ]
    assert "[`identity.width-two-bytes`](identity.md#identity.width-two-bytes)" in page


# --- the ring picture ----------------------------------------------------------------------


def test_ring_drawing_is_computed_from_the_layout_formulas() -> None:
    spec = with_ring(load(), layout=VLLM_LAYOUT, constants={})
    page = render_pages(spec)["ring.md"]
    art = drawing(page)
    # Two ruler lines, then one row per nesting level; one character per byte (57 bytes).
    assert art[1].split() == ["".join(str(i % 10) for i in range(57))]
    start = art[1].index("0")
    rows = [line[start:] for line in art[2:]]
    assert rows[0] == "[data" + " " * 42 + "][metadat]"
    assert rows[1] == "[chunk[0]      ][chunk[1]      ][chunk[2]      ][0][1][2]"
    assert rows[2] == "." * 48 + "WRRWRRWRR"
    assert "| 48 | 1 | `written_flag[0]` |" in page
    assert "| 53 | 1 | `read_flag[1, 1]` |" in page
    assert "| `total_bytes` | `max_chunks * (max_chunk_bytes + metadata_size)` | 57 |" in page
    assert "49, 50, 52, 53, 55, 56 (for chunk, reader = 0, 1, …)" in page


def test_ring_drawing_changes_with_the_formulas() -> None:
    """Metadata first, data after it: the same names, another picture."""
    layout = {
        **VLLM_LAYOUT,
        "metadata_offset": "0",
        "data_offset": "max_chunks * metadata_size",
    }
    page = render_pages(with_ring(load(), layout=layout, constants={}))["ring.md"]
    art = drawing(page)
    start = art[1].index("0")
    assert art[-1][start:].startswith("WRRWRRWRR")
    assert "| 9 | 16 | `chunk[0]` |" in page


def test_ring_formulas_may_use_constants_and_reader_aliases() -> None:
    layout = {"header": "0", "slots": "header_bytes", "slot": "slots + i * slot_bytes",
              "flag": "slot + n_readers"}
    page = render_pages(
        with_ring(load(), layout=layout, constants={"header_bytes": 4, "slot_bytes": 5})
    )["ring.md"]
    assert "| `flag` | `slot + n_readers` | 6, 11, 16 (for i = 0, 1, …) |" in page
    assert "| 4 | 5 | `slot[0]` |" in page


@pytest.mark.parametrize(
    "formula",
    ["__import__('os').system('true')", "max_chunks.bit_length()", "1.5 * max_chunks",
     "max_chunks / 0", "max_chunks ** 1000", "unknown_name + 1", "(", "lambda: 1"],
)
def test_ring_rejects_unsafe_or_broken_formulas_without_failing(formula: str) -> None:
    layout = {**VLLM_LAYOUT, "bogus_offset": formula}
    page = render_pages(with_ring(load(), layout=layout, constants={}))["ring.md"]
    assert "| `bogus_offset` |" in page
    row = next(line for line in page.splitlines() if line.startswith("| `bogus_offset` |"))
    assert "(not evaluated" in row
    assert "WRRWRRWRR" in page  # the rest is still drawn


def test_ring_states_diagram_follows_vllm_flag_semantics() -> None:
    page = render_pages(with_ring(load(), states=VLLM_STATES))["ring.md"]
    diagram = re.findall(r"```mermaid\n(.*?)```", page, flags=re.S)[0].splitlines()
    assert diagram[:6] == [
        "stateDiagram-v2",
        '    state "empty (0???...???)" as s0',
        '    state "written (1000...000)" as s1',
        '    state "partly-read (1???...???)" as s2',
        '    state "read (1111...111)" as s3',
        "    [*] --> s0",
    ]
    edges = {tuple(line.split(" : ")[0].split(" --> ")) for line in diagram[6:]}
    assert edges == {
        ("    s0", "s1"),  # the writer publishes
        ("    s1", "s2"),  # a first reader finishes
        ("    s2", "s2"),  # another, not the last
        ("    s2", "s3"),  # the last reader finishes
        ("    s3", "s0"),  # the writer takes the chunk back
    }


def test_empty_ring_tables_render() -> None:
    empty = with_ring(load(), layout={}, states=[], writer_steps=[], reader_steps=[],
                      framing=[], constants={})
    page = render_pages(empty)["ring.md"]
    assert "*(the layout formulas do not yet place any region)*" in page
    assert "*(no slot states in this version of the spec)*" in page
    assert isinstance(empty.surfaces["ring"], RingFile)


def test_prose_cannot_turn_into_markup() -> None:
    spec = load()
    identity = spec.surfaces["identity"]
    tricky = msgspec.structs.replace(
        identity.clauses[0],
        text="Raises TimeoutError(\"RPC call to <method> timed out\") below 2**64; "
             "vLLM's __post_init__ sets _all_stop_token_ids; `a <b> __c__` stays code.",
    )
    surface = msgspec.structs.replace(identity, clauses=[tricky, *identity.clauses[1:]])
    page = render_pages(dataclasses.replace(spec, surfaces={**spec.surfaces,
                                                            "identity": surface}))["identity.md"]
    assert (
        'Raises TimeoutError("RPC call to &lt;method> timed out") below 2\\*\\*64; '
        "vLLM's \\_\\_post_init\\_\\_ sets \\_all_stop_token_ids; `a <b> __c__` stays code."
    ) in page
