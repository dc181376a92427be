"""include/fattn/fattn.h calls the ops through typed dispatcher handles. The kernels are
registered boxed (stable ABI), so the dispatcher cannot check those C++ signatures against
the schemas at run time; this test does, from the schemas the library registers."""

import re
from pathlib import Path

import pytest
import torch

import fattn  # noqa: F401  (registers the ops)

HEADER = Path(__file__).resolve().parent.parent / "include" / "fattn" / "fattn.h"

# The C++ type a typed<> handle takes for each schema argument type (ATen's convention).
CPP_TYPES = {
    "Tensor": "const at::Tensor&", "Tensor?": "const std::optional<at::Tensor>&", "float": "double",
    "float?": "std::optional<double>", "bool": "bool", "int": "int64_t",
}


def _schema_cpp_types(op):
    types = []
    for arg in op.default._schema.arguments:
        text = str(arg.type).replace("Optional[Tensor]", "Tensor?").replace("Optional[float]", "float?")
        cpp = CPP_TYPES[text]
        if arg.alias_info is not None and arg.alias_info.is_write:
            cpp = "at::Tensor&"  # a mutable Tensor(a!) argument
        types.append(cpp)
    return types


def _header_cpp_types(name):
    text = HEADER.read_text()
    at = text.index(f'findSchemaOrThrow("fattn::{name}", "")')
    typed = text[at:text.index(">();", at)]
    params = typed[typed.index(">(") + 2:typed.rindex(")")]
    return [re.sub(r"\s+", " ", p).strip() for p in params.split(",")]


@pytest.mark.parametrize("name", ["forward", "decode"])
def test_header_signatures_match_the_registered_schemas(name):
    assert _header_cpp_types(name) == _schema_cpp_types(getattr(torch.ops.fattn, name))
