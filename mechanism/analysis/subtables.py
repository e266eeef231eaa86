"""The observed counts of a release summed onto named attributes, as the arrays the analyses take
(DESIGN 11).

A release's cells are the mixed-radix product of its attributes' categories, first attribute
slowest. PRAM replaces a whole joint cell by a uniform one, so summed onto ANY subset of attributes
with C cells the channel is again "keep w.p. a, else a uniform cell of the C" (DESIGN 3.5, which
states it for curator subsets; a uniform joint cell's projection on any attributes is uniform).
That is why every test, effect and model can work on the small table of the attributes it names.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.errors import (
    OldResultError,
    RepeatedAttributeError,
    UnknownAttributeError,
)

IntArray = npt.NDArray[np.int64]

#: A binned number's label: "[a, b)", or "[a, b]" for the last bin (``schema.bin_labels``).
_BIN_LABEL = re.compile(r"^\[[^,\[\]()]+, [^,\[\]()]+[)\]]$")


@dataclass(frozen=True)
class Layout:
    """The attributes of a release's cells: their names, categories (in code order) and the
    curator that holds each."""

    attributes: tuple[str, ...]
    categories: tuple[tuple[str, ...], ...]
    holders: tuple[str, ...]

    @property
    def levels(self) -> tuple[int, ...]:
        return tuple(len(c) for c in self.categories)

    def index(self, name: str) -> int:
        return self.attributes.index(name)

    def is_binned(self, name: str) -> bool:
        """True when every category of ``name`` is a bin label "[a, b)": a binned number, ordered."""
        return all(_BIN_LABEL.match(c) for c in self.categories[self.index(name)])


def layout(
    attributes: Sequence[str],
    labels: Sequence[Sequence[str]],
    curators: Sequence[str],
    alphabet_sizes: Sequence[int],
) -> Layout:
    """The :class:`Layout` of a report's cells. ``curators`` are those whose attributes the cells
    span, in order, and ``alphabet_sizes`` their k_j; each curator's attributes are the next ones
    whose level counts multiply to its k_j (DESIGN 3: a curator's symbol is the mixed-radix code
    of its attributes)."""
    arr = np.asarray(labels, dtype=str).reshape(len(labels), len(attributes))
    categories = tuple(tuple(dict.fromkeys(arr[:, j].tolist())) for j in range(len(attributes)))
    holders: list[str] = []
    for curator, size in zip(curators, alphabet_sizes, strict=True):
        product = 1
        while len(holders) < len(attributes) and product < size:
            product *= len(categories[len(holders)])
            holders.append(curator)
    holders += ["?"] * (len(attributes) - len(holders))  # never for a report this project wrote
    return Layout(tuple(attributes), categories, tuple(holders))


def check_names(lay: Layout, groups: Sequence[Sequence[str]], roles: Sequence[str]) -> None:
    """Raise unless every name is an attribute of the release and none is named twice (within a
    group or across groups, e.g. in both ``a`` and ``given``)."""
    seen: dict[str, str] = {}
    for group, role in zip(groups, roles, strict=True):
        for name in group:
            if name not in lay.attributes:
                raise UnknownAttributeError(
                    f"unknown attribute {name!r} (in {role}); the release has {list(lay.attributes)}"
                )
            if name in seen:
                where = role if seen[name] == role else f"both {seen[name]} and {role}"
                raise RepeatedAttributeError(
                    f"attribute {name!r} is named twice ({where}); name each attribute once"
                )
            seen[name] = role


def attribute_table(observed: npt.ArrayLike, lay: Layout, groups: Sequence[Sequence[str]]) -> IntArray:
    """The observed counts summed onto the attributes of ``groups``, one axis a group: a group of
    several attributes is flattened to one axis (mixed radix, first name slowest). An empty group
    gives an axis of length 1. Shape (prod of group 1's levels, prod of group 2's levels, ...)."""
    counts = np.asarray(observed)
    if counts.size != int(np.prod(lay.levels)):
        raise OldResultError(
            f"the release has {counts.size} observed counts for {int(np.prod(lay.levels))} cells; "
            "refetch it (`secure-release analyst show RELEASE --json > r.json`)"
        )
    cube = counts.astype(np.int64).reshape(lay.levels)
    order = [lay.index(name) for group in groups for name in group]
    dropped = tuple(j for j in range(len(lay.levels)) if j not in order)
    summed = cube.sum(axis=dropped) if dropped else cube
    kept = sorted(order)
    moved = np.transpose(summed, [kept.index(j) for j in order])
    shape = [int(np.prod([lay.levels[lay.index(n)] for n in group])) for group in groups]
    return np.asarray(moved.reshape(shape), dtype=np.int64)


def group_labels(lay: Layout, group: Sequence[str]) -> list[str]:
    """The labels of a group's flattened axis: "educ=HS, sex=F" (mixed radix, first name slowest)."""
    if not group:
        return ["(all)"]
    grids = np.meshgrid(*[np.arange(lay.levels[lay.index(n)]) for n in group], indexing="ij")
    codes = [g.reshape(-1) for g in grids]
    return [
        ", ".join(f"{n}={lay.categories[lay.index(n)][int(c[i])]}" for n, c in zip(group, codes, strict=True))
        for i in range(codes[0].size)
    ]


def cross_curator_pairs(lay: Layout) -> list[tuple[str, str]]:
    """Every pair of attributes held by different curators, in attribute order."""
    names = lay.attributes
    return [
        (names[i], names[j])
        for i in range(len(names))
        for j in range(i + 1, len(names))
        if lay.holders[i] != lay.holders[j]
    ]


def holm_adjust(p_values: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Holm's (1979) step-down adjusted p-values: sorted ascending, p_(i) (M - i + 1) with
    i = 1..M, made monotone by a running maximum and capped at 1. Controls the family-wise error
    rate at any dependence."""
    p = np.asarray(p_values, dtype=np.float64)
    order = np.argsort(p, kind="stable")
    scaled = p[order] * (p.size - np.arange(p.size))
    adjusted = np.minimum(np.maximum.accumulate(scaled), 1.0)
    out = np.empty_like(p)
    out[order] = adjusted
    return out
