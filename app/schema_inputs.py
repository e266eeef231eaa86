"""A curator's schema as the notebook takes it: a :class:`CuratorSchema`, a schema dict or file
(docs/own-data.md), or ``{attribute: [categories]}``; and where that curator's ids are."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias

from secure_release.frames import TableInputError
from secure_release.mechanism.schema import Attribute, CuratorSchema, attribute_from_dict, attribute_to_dict

#: One curator's schema as every notebook function takes it.
SchemaSpec: TypeAlias = CuratorSchema | Mapping[str, Any] | str | Path


def schema(curator: str, attributes: Mapping[str, Sequence[str]]) -> CuratorSchema:
    """A curator's schema from ``{attribute: [categories, in code order]}`` (from a public codebook)."""
    return CuratorSchema(curator, tuple(Attribute(a, tuple(str(c) for c in cats)) for a, cats in attributes.items()))


def schema_to_dict(s: CuratorSchema, id_column: str = "id") -> dict[str, Any]:
    """The schema file format the curator CLI reads (docs/own-data.md)."""
    return {
        "curator": s.name,
        "id_column": id_column,
        "attributes": [attribute_to_dict(a) for a in s.attributes],
    }


def load_schema(path: str | Path) -> CuratorSchema:
    """A curator's schema JSON file (docs/own-data.md)."""
    from secure_release.curator.table import load_schema as _load

    return _load(path).schema


class IdColumnConflictError(TableInputError):
    """The ``id_column=`` keyword names another column than the curator's schema does."""


def schema_and_id_column(curator: str, spec: SchemaSpec, id_column: str | None) -> tuple[CuratorSchema, str]:
    """A curator's schema and its id column: the schema's ``id_column`` (a file or dict that
    names one); ``id_column`` only fills in a schema without one (default "id"), and a schema
    that names another raises :class:`IdColumnConflictError` naming both."""
    declared: str | None = None
    if isinstance(spec, CuratorSchema):
        parsed = spec
    elif isinstance(spec, str | Path):
        try:
            data = json.loads(Path(spec).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        declared = data.get("id_column") if isinstance(data, dict) else None
        parsed = load_schema(spec)
    elif "attributes" in spec and isinstance(spec["attributes"], list):
        attrs = tuple(attribute_from_dict(a) for a in spec["attributes"])
        parsed = CuratorSchema(str(spec.get("curator", curator)), attrs)
        declared = spec.get("id_column")
    else:
        parsed = schema(curator, spec)
    if declared is not None and id_column is not None and str(declared) != id_column:
        raise IdColumnConflictError(
            f"curator {curator}: the schema says the ids are in column {str(declared)!r} (its \"id_column\"), "
            f"but id_column={id_column!r} was given; drop the keyword or make them agree"
        )
    return parsed, str(declared) if declared is not None else (id_column or "id")


def schemas_in_order(schemas: Mapping[str, SchemaSpec] | Sequence[SchemaSpec]) -> list[CuratorSchema]:
    """The curators' schemas, in order: a mapping's keys name them (as ``api.release`` reads its
    tables); a list's entries name themselves (``curator<j>`` for a bare ``{attribute: [...]}``)."""
    if isinstance(schemas, Mapping):
        return [CuratorSchema(name, schema_and_id_column(name, s, None)[0].attributes) for name, s in schemas.items()]
    return [schema_and_id_column(f"curator{j + 1}", s, None)[0] for j, s in enumerate(schemas)]
