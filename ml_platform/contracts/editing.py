"""Rewriting the `resources:` section of a contract file, and only it.

A contract is a file a person curates: its comments say why a threshold is what it is. A
command that writes sizes into it (`ml-platform resources --write`) replaces the lines of the
top-level `resources:` section and keeps every other byte. The section runs from its key to
the next top-level key; comment and blank lines at the left margin just before that key are
the next section's (the bundled contracts comment a section above its key). A file without
the section gets it at its end.
"""

from pathlib import Path

import yaml

from ml_platform.contracts.model import BUNDLED_DIR, STAGES, ContractError, ResourcesSpec

SECTION = "resources"
# Where the package's bundled contracts are part of a source tree a person edits (an editable
# install, as `make env` makes): its project file is beside the package.
SOURCE_TREE_MARKER = BUNDLED_DIR.parent.parent / "pyproject.toml"


def render_resources(spec: ResourcesSpec, note: str) -> str:
    """The `resources:` section for `spec`: every stage's request, the bounds the file set.

    `note` is a comment line (or lines) inside the section saying where the sizes come from.
    """
    lines = [f"{SECTION}:"]
    lines += [f"  # {line}" if line else "  #" for line in note.splitlines()]
    lines.append("  stages:")
    width = max(len(stage) for stage in STAGES) + 1
    for stage in STAGES:
        size = spec.size(stage)
        lines.append(f"    {stage + ':':<{width}} {{cpu: {size.cpu:g}, memory: {size.memory}}}")
    for bound in ("min_cpu", "max_cpu", "min_memory_mb", "max_memory_mb"):
        if bound in spec.model_fields_set:
            lines.append(f"  {bound}: {getattr(spec, bound):g}")
    return "\n".join(lines) + "\n"


def section_lines(text: str, source: str = "the contract") -> tuple[int, int] | None:
    """The 0-based [start, end) lines of the top-level `resources:` section; None if absent.

    A file with two `resources:` keys is a ContractError naming `source` and their lines: YAML
    loads the last, so rewriting either would leave the sizes the code location serves unclear.
    """
    root = yaml.compose(text)
    if not isinstance(root, yaml.MappingNode):
        return None
    starts = [key.start_mark.line for key, _ in root.value]
    keys = [key.value for key, _ in root.value]
    if SECTION not in keys:
        return None
    if keys.count(SECTION) > 1:
        twice = [str(start + 1) for start, key in zip(starts, keys, strict=True) if key == SECTION]
        raise ContractError(
            source,
            [
                f"lines {' and '.join(twice)}: '{SECTION}' is a key twice; YAML keeps the "
                "last: remove one"
            ],
        )
    index = keys.index(SECTION)
    lines = text.splitlines(keepends=True)
    # The last section ends with the document: a `...` end marker and what follows it stay.
    end_of_document = root.end_mark.line + (1 if root.end_mark.column else 0)
    end = starts[index + 1] if index + 1 < len(starts) else min(end_of_document, len(lines))
    # The next section's own comment (and the blank lines around it) stays with it.
    while end > starts[index] + 1 and _margin_note(lines[end - 1]):
        end -= 1
    return starts[index], end


def _margin_note(line: str) -> bool:
    return not line.strip() or line.startswith("#")


def replace_resources(text: str, section: str, source: str = "the contract") -> str:
    """`text` with its `resources:` section replaced by `section` (appended if absent).

    `source` names the file in a ContractError. The section takes the file's line endings: a
    file written on Windows (CRLF) stays CRLF, with no line of another kind in it.
    """
    newline = "\r\n" if "\r\n" in text else "\n"
    section = section.replace("\r\n", "\n").replace("\n", newline)
    where = section_lines(text, source)
    if where is None:
        separator = "" if not text or text.endswith("\n") else newline
        return f"{text}{separator}{section}"
    start, end = where
    lines = text.splitlines(keepends=True)
    tail = lines[end:]
    body = section
    if not lines[end - 1].endswith("\n") and not tail:
        body = section.rstrip("\r\n")
    return "".join(lines[:start]) + body + "".join(tail)


def editable_contract(path: Path, source_tree_marker: Path = SOURCE_TREE_MARKER) -> Path:
    """`path` if a person may rewrite it; a ContractError for a file of the installed package.

    A bundled contract is written only when the package runs from its source tree (the
    repository's own file, committed like any change); in an installed package the next
    install would silently undo the edit, so the user is told to copy it and point
    ML_PLATFORM_CONTRACTS (or `--contract`) at the copy.
    """
    resolved = path.resolve()
    bundled = resolved.parent == BUNDLED_DIR.resolve()
    if bundled and not source_tree_marker.is_file():
        raise ContractError(
            str(path),
            [
                "this is the installed package's bundled contract, which the next install "
                "replaces: copy it into a contracts directory of your own, serve that "
                "directory (ML_PLATFORM_CONTRACTS) and write there (--contract PATH)"
            ],
        )
    return path
