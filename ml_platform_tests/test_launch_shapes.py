"""Contract files of unusual shapes as `ml-platform resources --write` edits them.

A repeated `resources:` key, a file with Windows line endings (CRLF), a document end marker.
"""

import pytest

from ml_platform.contracts.editing import render_resources, replace_resources
from ml_platform.contracts.model import BUNDLED_DIR, ContractError, ResourcesSpec, parse_contract

NEW = render_resources(ResourcesSpec(max_memory_mb=4096), "advised")


def test_a_contract_with_two_resources_sections_is_refused_naming_their_lines():
    text = (BUNDLED_DIR / "synthetic.yaml").read_text()
    first = text.splitlines().index("resources:") + 1
    # Someone appended a section without seeing the one above: YAML loads the last.
    text += "resources:\n  max_memory_mb: 2048\n"
    assert parse_contract(text, "sales.yaml").resources.max_memory_mb == 2048

    with pytest.raises(ContractError) as refused:
        replace_resources(text, NEW, "sales.yaml")

    message = str(refused.value)
    assert message.startswith("sales.yaml:"), message
    assert f"lines {first} and {len(text.splitlines()) - 1}" in message, message
    assert "'resources' is a key twice" in message, message


def test_a_crlf_contract_keeps_its_line_endings_in_the_new_section():
    lf = (BUNDLED_DIR / "synthetic.yaml").read_text()
    crlf = lf.replace("\n", "\r\n")

    written = replace_resources(crlf, NEW, "sales.yaml")

    assert written == replace_resources(lf, NEW).replace("\n", "\r\n")
    assert parse_contract(written, "sales.yaml").resources.max_memory_mb == 4096
    # A file without the section, and one that ends without a line break, get it the same way.
    without = "name: x\r\nowners: [team:a]"
    assert replace_resources(without, NEW) == without + "\r\n" + NEW.replace("\n", "\r\n")


def test_a_last_section_before_a_document_end_marker_keeps_the_marker_and_comments():
    text = "name: x\nresources:\n  max_cpu: 2\n# sizes reviewed in March\n...\n# kept\n"

    written = replace_resources(text, "resources:\n  max_cpu: 3\n")

    assert written == "name: x\nresources:\n  max_cpu: 3\n# sizes reviewed in March\n...\n# kept\n"
