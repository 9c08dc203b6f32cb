"""The analyst's statistics against OpenDP: error and time of a release at the same epsilon.

    python -m bench.utility_stats [--repeat 200] [--epsilon 1.0] [--rows PATTERN ...]

Every row is one statistic on one table (``tables.py``: the diabetes demo data, a generated
20,000-row census and a generated 178-row chemistry table), released ``repeat`` times at
``epsilon`` by dpnode, as an analyst writes it (``dpnode_side.py``: torch on remote tensors,
the query builder, ``ds.describe``), and by OpenDP 0.16 with its constructors
(``opendp_side.py``), the releases of the two sides interleaved. Per row: each side's mean
absolute error against the true value, their ratio with two standard errors (the delta
method over the releases; below 1: dpnode is more accurate), the median time of one release
on each side and their ratio, and whether dpnode meets the product's targets (error ratio at
most 1 within two standard errors, time at most 1.5 times OpenDP's): "ok", "behind: error /
time", or "refused" (dpnode's refusal is printed in its cell; the bench goes on). ``--rows``
keeps the rows whose "table: statistic" contains one of the patterns.

Both sides have the same public information and the same neighbours: the row count and the
declared bounds and category keys are public, and a neighbouring dataset replaces one row
(dpnode's privacy unit; for OpenDP a sized vector domain and a symmetric distance of 2, each
measurement calibrated by ``binary_search`` so that ``map(2)`` is the row's epsilon). Every
row is pure epsilon-DP on OpenDP's side (so also (epsilon, delta)-DP for any delta), and on
dpnode's except the regression (Gaussian at delta 1e-6).

* Count, sum, mean, variance, histogram, share: Laplace; a count (and a share's) is the sum
  of a 0/1 indicator on the sized domain, a histogram OpenDP's ``count_by_categories``.
* Quantiles (and describe's, and the per-group minima and maxima, quantiles 0 and 1): OpenDP
  scores dpnode's public candidates (``then_quantile_score_candidates``: every integer of an
  integer column's bounds, else 4097 equally spaced points over them) and picks one with its
  noisy max (exponential noise). Whole-number values held as floats (diabetes' ages) leave
  about half a unit of error at any epsilon on both sides.
* Per-group means and variances, a filtered mean, covariance, correlation and the regression
  (OpenDP has no partition combinator outside its polars front end, which needs another
  polars than this environment's): each row becomes one vector of its centred value's powers
  and a count in its group's place (a filter is a group of one; the covariance's and the
  regression's are the centred products), bounded in L1 (``then_np_clamp``), summed
  (``then_np_sum``, under OpenDP's "idealized-numerics") and noised once with Laplace; a
  replaced row moves out of one group and into another inside that one vector. Means,
  variances, covariances and the normal equations are solved from the sums as dpnode does.
* Two-key counts and top-k: ``count_by_categories`` over the public key pairs (L1 2 for a
  replaced row); the top k are the largest noised counts (better here than OpenDP's
  ``noisy_top_k``, whose scores under a replacement need twice the scale per pick).
* Count distinct: OpenDP's ``count_distinct``, whose stability counts a replaced row as 2.
* Minima and maxima per group: two selections per group at half the epsilon each, on the
  group's rows (its size private): a replaced row moves one group by 2 or two by 1.
* Describe: mean, standard deviation and five quantiles of each numeric column (the count is
  public), each at an equal share of epsilon; its error is each entry's over its column's
  public width, averaged.
* Keys above a threshold (the census' zip codes: 1,500 in use among 100,000 possible, of
  Zipf-like popularity): dpnode's ``discover_keys`` against OpenDP's ``make_count_by`` and
  ``then_laplace_threshold``, both at delta 1e-6 with noise of scale ``2 / epsilon``, OpenDP's
  threshold the smallest integer its map puts within delta for a replaced row. Three rows of
  the same release: the error of the released counts (over the keys each side keeps), the
  share of zips of at least 50 rows missed, and how many zips present were not released.

Errors: a vector's is the mean over its elements; a covariance's over its upper triangle, a
correlation's off the diagonal; top k's, rank by rank, how far the true count of the group
named is from the true count at that rank. Time: a dpnode release is the whole publish
(recording the graph or query, the request to the in-process node, tracking, evaluation,
noise, the ledger); an OpenDP release is the measurement's call, with turning the table's
NumPy columns into its input (a list, or the rows of moments) and the post-processing.
"""

from bench.utility_stats.opendp_side import REPLACE_ONE
from bench.utility_stats.report import error_line

#: ``bench/moments.py``'s name for :func:`error_line`
_row = error_line

__all__ = ["REPLACE_ONE", "error_line"]
