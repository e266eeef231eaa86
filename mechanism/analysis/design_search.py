"""The search behind :func:`mechanism.analysis.design.design`: which tables to release, each
table's sample m_t and gamma_t, under one total epsilon. Pure numpy, public inputs only.

**A question in a table** (power.py's module text). Table t holds K_t joint cells and m_t
records; gamma_t-diagonal PRAM keeps a record's cell with probability a_t = x_t/(x_t + K_t), x_t =
gamma_t - 1, else draws a uniform one. Summed onto a question's C = I J L cells (pair A x B,
strata the L joint levels of the given attributes) it is "keep with a_t, else uniform of C", so
o ~ Multinomial(m_t, a_t p + (1 - a_t)/C).

**The stratified test** (:func:`stratified_information`; power.py has no conditional planner).
Stratum l (share w_l) holds a share w'_l = a w_l + (1 - a)/L of the records; given that, its pair
is a pair channel with keep a_l = a w_l / w'_l (:func:`stratum_keep`). The conditional LRT's
statistic is asymptotically the sum of the strata's, so under local alternatives with the same
Cramer's V in every stratum its noncentrality is the sum over strata of the pair's:
lambda = sum_l (m w'_l) a_l^2 mu(a_l) V^2 (min(I, J) - 1) = m g(a) V^2 (min(I, J) - 1), with
g(a) = sum_l (a w_l)^2 / w'_l mu(a_l), mu power.py's :func:`marginal_efficiency` (1 when the pair's
shares are uniform), df = L (I - 1)(J - 1). Uniform strata: g(a) = a^2 mu(a), the pair's. Ignored:
the L - 1 directions of the strata's totals in the null model (measured: they lower mu by at most
5% for shares down to 0.1, none at uniform shares). A model Y ~ X1 + X2 + ... is planned as
Y ~ X1 | X2 + ...: the saturated stratified test has more df than a main-effects model's, so for an
effect the same in every stratum the plan is conservative. The minimum detectable V is
1/sqrt(m r(a)), r(a) = g(a) (min(I, J) - 1)/lambda*(df) (:func:`detectable_v`).

**Eq. (T1) as one linear constraint** (:func:`epsilon_cost`). With E = e^epsilon, Eq. (T1)'s ratio
for S is at most E iff sum_{t in S} q_t x_t + E sum_{t not in S} q_t x_t/gamma_t <= E - 1; the
left side is largest with t in S iff gamma_t >= E, so Eq. (T1) <= epsilon iff
sum_t q_t u(x_t) <= c = E - 1, u(x) = x max(1, E/(1 + x)) (docs/privacy.md, Eq. T1, T2).

**The split for given tables** (:func:`solve`). The worst question of table t has 1/V^2 =
q_t h_t, h_t = n min_q r_q(a_t). Maximise z = min_t q_t h_t under sum_t q_t u_t <= c and
sum_t q_t <= 1: at the optimum every q_t h_t = z, q_t = z/h_t and
z = min(c / sum_t u_t/h_t, 1 / sum_t 1/h_t) (:func:`split_for_gammas`). Over the gammas the two
sums trade off; each point of their lower frontier minimises sum_t (u_t + mu)/h_t for a multiplier
mu >= 0, separately in every x_t. So: mu = 0 and a geometric grid of :data:`MU_POINTS` mu, then
:data:`MU_POINTS` more between the best one's neighbours; for each, every table's x_t on a
geometric grid of :data:`RHO_POINTS` values of x_t/K_t, refined by golden section for the result.

**The table sets** (:func:`table_sets`). A table set is a partition of the questions into blocks,
each answered by one table holding the union of its attributes; a block must be connected by
shared attributes (merging disjoint questions only multiplies K). All such partitions when there
are at most :data:`MAX_TABLE_SETS`, else a greedy merging within that many evaluations; plus the
whole joint (one table of every attribute) as a baseline.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
from scipy import stats

from secure_release.mechanism.analysis import power as pw
from secure_release.mechanism.analysis.questions import Question, geometric_shares

FloatArray = npt.NDArray[np.float64]
#: Grid of x_t/K_t per table (then golden section), and of the multiplier mu (twice).
RHO_POINTS = 320
MU_POINTS = 64
#: The most table sets :func:`table_sets` returns (and the greedy merging evaluates).
MAX_TABLE_SETS = 300
#: Partitions enumerated before the greedy merging takes over (Bell(8) = 4140).
MAX_PARTITIONS = 5000
#: The efficiency's interpolation grid, in logit(a).
LOGIT_GRID = np.linspace(-16.0, 16.0, 289)
_GOLDEN = 0.5 * (math.sqrt(5.0) - 1.0)

Table = tuple[frozenset[str], tuple[int, ...]]  # (attributes, indices of the questions it answers)


# ------------------------------------------------------------------------------- the formulas
def stratum_keep(keep: FloatArray | float, strata: FloatArray) -> FloatArray:
    """a_l = a w_l / (a w_l + (1 - a)/L): the pair's keep within stratum l (module text)."""
    a = np.asarray(keep, dtype=np.float64)[..., None]
    return np.asarray(a * strata / (a * strata + (1.0 - a) / strata.size), dtype=np.float64)


def stratified_information(keep: FloatArray | float, strata: FloatArray, efficiency: FloatArray) -> FloatArray:
    """g(a) = sum_l (a w_l)^2 / (a w_l + (1 - a)/L) mu(a_l) (module text); ``efficiency`` holds
    mu(a_l) in the shape of :func:`stratum_keep`. a^2 mu(a) at L = 1."""
    a = np.asarray(keep, dtype=np.float64)[..., None]
    return np.asarray(np.sum((a * strata) ** 2 / (a * strata + (1.0 - a) / strata.size) * efficiency, axis=-1))


def epsilon_cost(excess: FloatArray, e_epsilon: float) -> FloatArray:
    """u(x) = x max(1, E/(1 + x)), x = gamma - 1, E = e^epsilon: Eq. (T1) <= epsilon iff
    sum_t q_t u(x_t) <= E - 1 (module text; docs/privacy.md Eq. T1, T2)."""
    x = np.asarray(excess, dtype=np.float64)
    return np.asarray(x * np.maximum(1.0, e_epsilon / (1.0 + x)), dtype=np.float64)


def split_for_gammas(h: FloatArray, u: FloatArray, c: float) -> tuple[FloatArray, FloatArray]:
    """(z, q): the best worst-case 1/V^2, z = min(c / sum_t u_t/h_t, 1 / sum_t 1/h_t), and the
    shares q_t = z/h_t of n (module text); over the last axis, batched over the others."""
    z = np.minimum(c / np.sum(u / h, axis=-1), 1.0 / np.sum(1.0 / h, axis=-1))
    return np.asarray(z, dtype=np.float64), np.asarray(z[..., None] / h, dtype=np.float64)


def detectable_v(m: float, rate: float) -> float:
    """V = 1/sqrt(m r(a)) (module text); inf where above 1 (no table is dependent enough)."""
    v = 1.0 / math.sqrt(m * rate) if m * rate > 0 else math.inf
    return v if v <= 1.0 else math.inf


# ---------------------------------------------------------------------------- one question
@dataclass(frozen=True, eq=False)
class QuestionNeed:
    """What the search knows of one question: its attributes, the tested pair's levels (I, J),
    the strata shares w (L,), the pair's shares (uniform unless public ones are given), df,
    lambda*(df) and mu on :data:`LOGIT_GRID` (None: uniform pair shares, mu = 1)."""

    attributes: frozenset[str]
    rows: int
    cols: int
    strata: FloatArray
    row_shares: FloatArray
    col_shares: FloatArray
    df: int
    required: float
    grid: FloatArray | None

    @property
    def min_levels(self) -> int:
        return min(self.rows, self.cols)

    @property
    def cells(self) -> int:
        return self.rows * self.cols * self.strata.size

    @property
    def uniform(self) -> bool:
        return self.grid is None and bool(np.all(self.strata == self.strata[0]))

    def efficiency(self, keep: FloatArray, exact: bool = False) -> FloatArray:
        """mu(a) of the pair (power.marginal_efficiency's worst direction): interpolated in
        logit(a) on the grid, or ``exact``; 1 with uniform pair shares."""
        a = np.asarray(keep, dtype=np.float64)
        if self.grid is None:
            return np.ones_like(a)
        if exact:
            flat = [pw.marginal_efficiency(float(x), self.row_shares, self.col_shares)[0] for x in a.ravel()]
            return np.asarray(flat, dtype=np.float64).reshape(a.shape)
        logit = np.log(a) - np.log1p(-np.minimum(a, 1.0 - 1e-16))
        return np.asarray(np.interp(logit, LOGIT_GRID, self.grid), dtype=np.float64)

    def information(self, keep: FloatArray | float, exact: bool = False) -> FloatArray:
        """g(a) (:func:`stratified_information`)."""
        a = np.asarray(keep, dtype=np.float64)
        if self.uniform:
            return np.asarray(a * a, dtype=np.float64)
        return stratified_information(a, self.strata, self.efficiency(stratum_keep(a, self.strata), exact))

    def rate(self, keep: FloatArray | float, exact: bool = False) -> FloatArray:
        """r(a) = g(a) (min(I, J) - 1)/lambda*(df): 1/V^2 per record (:func:`detectable_v`)."""
        return np.asarray(self.information(keep, exact) * (self.min_levels - 1) / self.required)

    def power_at(self, v: float, m: int, keep: float, alpha: float) -> float:
        """Asymptotic power at Cramer's V = ``v``: P(chi2_df(lambda) > chi2_df quantile 1 - alpha),
        lambda = m g(a) V^2 (min(I, J) - 1) (module text)."""
        lam = m * float(self.information(keep, exact=True)) * v * v * (self.min_levels - 1)
        crit = float(stats.chi2.isf(alpha, self.df))
        return float(stats.chi2.sf(crit, self.df) if lam == 0 else stats.ncx2.sf(crit, self.df, lam))


def question_need(
    question: Question, levels: dict[str, int], shares: dict[str, FloatArray], alpha: float, power: float
) -> QuestionNeed:
    """The :class:`QuestionNeed` of ``question``: ``levels`` every attribute's level count,
    ``shares`` the public shares of those that have them."""
    a, b, given = question.tested
    strata = np.ones(1)
    for name in given:
        strata = np.outer(strata, shares.get(name, np.full(levels[name], 1.0 / levels[name]))).ravel()
    rows, cols = pw.check_levels(levels[a], levels[b])
    r, s = shares.get(a, np.full(rows, 1.0 / rows)), shares.get(b, np.full(cols, 1.0 / cols))
    df = strata.size * (rows - 1) * (cols - 1)
    grid = efficiency_grid(r, s) if a in shares or b in shares else None
    return QuestionNeed(frozenset(question.attributes), rows, cols, np.asarray(strata / strata.sum()), r, s, df,
                        pw.required_noncentrality(df, alpha, power), grid)  # fmt: skip


def efficiency_grid(row_shares: FloatArray, col_shares: FloatArray) -> FloatArray:
    """power.marginal_efficiency's worst-direction mu at every keep of :data:`LOGIT_GRID`."""
    keeps = 1.0 / (1.0 + np.exp(-LOGIT_GRID))
    return np.asarray([pw.marginal_efficiency(float(a), row_shares, col_shares)[0] for a in keeps])


def skewed_need(need: QuestionNeed, skew: float) -> QuestionNeed:
    """``need`` with :func:`geometric_shares` for every uniform share vector of the pair and of
    the strata (as one attribute of L levels)."""

    def skewed(v: FloatArray) -> FloatArray:
        return v if np.any(v != v[0]) else geometric_shares(v.size, skew)

    r, s, strata = skewed(need.row_shares), skewed(need.col_shares), skewed(need.strata)
    return replace(need, row_shares=r, col_shares=s, grid=efficiency_grid(r, s), strata=strata)


def planned_figures(
    need: QuestionNeed, m: int, keep: float, alpha: float, power: float, at_v: float | None, replicates: int, seed: int
) -> tuple[float, str, float | None]:
    """(V, how, power at ``at_v``) of one question at (m, a): a pair as power_plan plans it
    (simulated at small m), else asymptotic by the stratified noncentrality (module text)."""
    k = np.asarray(keep)
    pair = need.strata.size == 1
    if pair:
        mu = float(need.efficiency(k, exact=True))
        v, how = pw.planned_min_detectable_cramers_v(m, keep, need.rows, need.cols, alpha, power, mu, replicates, seed)
    else:
        g = float(need.information(k, exact=True))
        v = pw.min_detectable_cramers_v(m, keep, need.df, need.min_levels, alpha, power, g / keep**2)
        small = m * g / need.cells < pw.SIMULATE_BELOW_INFORMATION
        how = "asymptotic (stratified; small m: optimistic)" if small else "asymptotic (stratified)"
    p = None
    if at_v is not None:
        simulate = pair and need.grid is None and pw.needs_simulation(m, keep, need.rows, need.cols) \
            and at_v <= pw.max_uniform_cramers_v(need.rows, need.cols)  # fmt: skip
        p = pw.simulated_power(at_v, m, keep, need.rows, need.cols, alpha, replicates, seed) if simulate \
            else need.power_at(at_v, m, keep, alpha)  # fmt: skip
    return v, how, p


def skew_factor(need: QuestionNeed, keep: float, skew: float) -> float:
    """V with :func:`skewed_need`'s shares over V with ``need``'s, at keep a: sqrt(g/g_skewed)."""
    skewed = skewed_need(need, skew)
    return math.sqrt(float(need.information(keep, exact=True)) / float(skewed.information(keep, exact=True)))


# ------------------------------------------------------------------------------- the split
@dataclass(frozen=True, eq=False)
class Split:
    """A table set's continuous optimum: per table K_t, q_t = m_t/n, x_t = gamma_t - 1, and z,
    the worst question's 1/V^2 (asymptotic)."""

    tables: tuple[Table, ...]
    sizes: tuple[int, ...]
    fractions: FloatArray
    excess: FloatArray
    z: float

    @property
    def worst_v(self) -> float:
        return detectable_v(1.0, self.z)

    def question_v(self, needs: Sequence[QuestionNeed], n: int) -> list[float]:
        """Each question's asymptotic V at this split (from its own table)."""
        out = [math.inf] * len(needs)
        for t, (_, members) in enumerate(self.tables):
            a = self.excess[t] / (self.excess[t] + self.sizes[t])
            for i in members:
                out[i] = detectable_v(self.fractions[t] * n, float(needs[i].rate(a)))
        return out


def _table_size(attributes: frozenset[str], levels: dict[str, int]) -> int:
    return math.prod(levels[name] for name in attributes)


def solve(
    n: int, epsilon: float, needs: Sequence[QuestionNeed], levels: dict[str, int], tables: Sequence[Table],
    refine: bool = False,
) -> Split:  # fmt: skip
    """The best split of n and epsilon over ``tables`` (module text): grids, and with
    ``refine`` a finer multiplier grid and golden section on every x_t."""
    e_eps = math.exp(min(epsilon, 700.0))
    c = math.expm1(min(epsilon, 700.0))
    sizes = np.asarray([_table_size(attrs, levels) for attrs, _ in tables], dtype=np.float64)
    member = np.zeros((len(tables), len(needs)), dtype=bool)
    for t, (_, members) in enumerate(tables):
        member[t, list(members)] = True
    top = max(1e6, 1e3 * c / float(sizes.min()))
    rho = np.geomspace(1e-4, top, RHO_POINTS)
    rates = np.stack([nd.rate(rho / (1.0 + rho)) for nd in needs])  # (Q, R)
    h = n * np.min(np.where(member[:, :, None], rates[None], np.inf), axis=1)  # (T, R)
    u = epsilon_cost(sizes[:, None] * rho[None, :], e_eps)  # (T, R)

    def pick(mus: FloatArray) -> tuple[FloatArray, FloatArray]:
        at = np.argmin((u[None] + mus[:, None, None]) / h[None], axis=2)  # (M, T)
        hh = np.take_along_axis(h[None], at[..., None], 2)[..., 0]
        uu = np.take_along_axis(u[None], at[..., None], 2)[..., 0]
        return split_for_gammas(hh, uu, c)[0], at

    scale = max(c, float(sizes.max())) * len(tables)
    mus = np.concatenate([[0.0], np.geomspace(1e-6 * min(c, float(sizes.min())), 1e6 * scale, MU_POINTS)])
    z, at = pick(mus)
    best = int(np.argmax(z))
    if refine and best > 0:
        lo, hi = mus[best - 1] if best > 1 else mus[1] / 10, mus[min(best + 1, len(mus) - 1)]
        fine = np.geomspace(max(lo, 1e-300), hi, MU_POINTS)
        z2, at2 = pick(fine)
        if z2.max() > z[best]:
            mus, z, at, best = fine, z2, at2, int(np.argmax(z2))
    log_rho = np.log(rho[at[best]])
    if refine:
        log_rho = _golden(log_rho, float(mus[best]), sizes, member, needs, n, e_eps, float(np.log(rho[1] / rho[0])))
    x = sizes * np.exp(log_rho)
    zz, q = split_for_gammas(_worst_h(x / (x + sizes), member, needs, n), epsilon_cost(x, e_eps), c)
    if refine and zz < z[best]:  # golden section moved the Lagrangian's optimum, not z's: keep the grid's
        x = sizes * rho[at[best]]
        zz, q = split_for_gammas(_worst_h(x / (x + sizes), member, needs, n), epsilon_cost(x, e_eps), c)
    return Split(tuple(tables), tuple(int(k) for k in sizes), q, x, float(zz))


def _worst_h(keep: FloatArray, member: npt.NDArray[np.bool_], needs: Sequence[QuestionNeed], n: int) -> FloatArray:
    """h_t = n min over table t's questions of r_q(a_t)."""
    rates = np.stack([nd.rate(keep) for nd in needs], axis=1)  # (T, Q)
    return np.asarray(n * np.min(np.where(member, rates, np.inf), axis=1), dtype=np.float64)


def _golden(
    log_rho: FloatArray, mu: float, sizes: FloatArray, member: npt.NDArray[np.bool_], needs: Sequence[QuestionNeed],
    n: int, e_eps: float, step: float, iterations: int = 48,
) -> FloatArray:  # fmt: skip
    """Golden section on every table's log(x_t/K_t) at once, within one grid step either side,
    of (u(x_t) + mu)/h_t(a_t)."""

    def f(lr: FloatArray) -> FloatArray:
        x = sizes * np.exp(lr)
        return np.asarray((epsilon_cost(x, e_eps) + mu) / _worst_h(x / (x + sizes), member, needs, n))

    lo, hi = log_rho - step, log_rho + step
    for _ in range(iterations):
        c1, c2 = hi - _GOLDEN * (hi - lo), lo + _GOLDEN * (hi - lo)
        left = f(c1) < f(c2)
        hi, lo = np.where(left, c2, hi), np.where(left, lo, c1)
    mid = 0.5 * (lo + hi)
    return np.asarray(np.where(f(mid) <= f(log_rho), mid, log_rho))


# -------------------------------------------------------------------------- the table sets
def _connected(blocks: Sequence[frozenset[str]]) -> bool:
    """Whether attribute sets are connected by sharing attributes."""
    reached, frontier = {0}, [0]
    while frontier:
        i = frontier.pop()
        for j, other in enumerate(blocks):
            if j not in reached and blocks[i] & other:
                reached.add(j)
                frontier.append(j)
    return len(reached) == len(blocks)


def _partitions(items: list[int]) -> Iterator[list[list[int]]]:
    """Every set partition of ``items`` (all singletons first)."""
    if not items:
        yield []
        return
    for rest in _partitions(items[1:]):
        yield [[items[0]], *rest]
        for i in range(len(rest)):
            yield [*rest[:i], [items[0], *rest[i]], *rest[i + 1:]]


def _as_tables(blocks: Sequence[Sequence[int]], needs: Sequence[QuestionNeed]) -> tuple[Table, ...]:
    return tuple((frozenset().union(*(needs[i].attributes for i in b)), tuple(sorted(b))) for b in blocks)


def table_sets(needs: Sequence[QuestionNeed]) -> tuple[list[tuple[Table, ...]], bool]:
    """(every connected partition's tables, True) when there are at most :data:`MAX_TABLE_SETS`
    (and Bell(Q) <= :data:`MAX_PARTITIONS`); else ([], False): then :func:`greedy` merges."""
    found: list[tuple[Table, ...]] = []
    for count, blocks in enumerate(_partitions(list(range(len(needs))))):
        if count >= MAX_PARTITIONS:
            return [], False
        if all(_connected([needs[i].attributes for i in b]) for b in blocks):
            found.append(_as_tables(blocks, needs))
            if len(found) > MAX_TABLE_SETS:
                return [], False
    return found, True


def greedy(
    score: dict[tuple[Table, ...], float], evaluate: Callable[[tuple[Table, ...]], float],
    needs: Sequence[QuestionNeed],
) -> None:  # fmt: skip
    """Merge greedily from the singletons: at each step evaluate (``evaluate(tables) -> z``)
    every merge of two blocks sharing an attribute, keep the best, until none is left or
    :data:`MAX_TABLE_SETS` table sets were evaluated; ``score`` collects them all."""
    blocks = [[i] for i in range(len(needs))]
    score[_as_tables(blocks, needs)] = evaluate(_as_tables(blocks, needs))
    while len(blocks) > 1 and len(score) < MAX_TABLE_SETS:
        options = []
        tables = _as_tables(blocks, needs)
        for i in range(len(blocks)):
            for j in range(i + 1, len(blocks)):
                if tables[i][0] & tables[j][0]:
                    merged = [b for k, b in enumerate(blocks) if k not in (i, j)] + [blocks[i] + blocks[j]]
                    key = _as_tables(merged, needs)
                    if key not in score and len(score) < MAX_TABLE_SETS:
                        score[key] = evaluate(key)
                    options.append((score.get(key, -math.inf), merged))
        if not options:
            return
        blocks = max(options, key=lambda o: o[0])[1]
