"""The statistics the results pages quote: mean ± std over seeds, Welch's t-test, a block bootstrap of a paired
error difference. (Not ``statistics.py``: a script of this folder run by its path would shadow the standard one.)
"""
from __future__ import annotations

import math

import numpy as np


def mean_std(values, digits: int = 3) -> str:
  """``mean ± std`` (sample std) of the finite values, and how many are not; a single value alone (no spread)."""
  values = np.asarray(values, np.float64).ravel()
  finite = values[np.isfinite(values)]
  if not finite.size:
    return "n/a"
  if values.size == 1:
    return f"{finite[0]:.{digits}f}"
  spread = finite.std(ddof=1) if finite.size > 1 else 0.0
  text = f"{finite.mean():.{digits}f} ± {spread:.{digits}f}"
  return text if finite.size == values.size else f"{text} ({values.size - finite.size} not finite)"


def student_t_two_sided_p(t: float, df: float) -> float:
  """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom: I_{df / (df + t^2)}(df / 2, 1 / 2)."""
  import scipy.special
  return float(scipy.special.betainc(df / 2.0, 0.5, df / (df + t * t)))


def welch_t_test(a, b) -> tuple[float, float, float]:
  """``(t, Welch-Satterthwaite df, two-sided p)`` of two samples' means (each of at least 2 finite values, else a
  ValueError); both constant: (+-inf, nan, 0) when the means differ, (nan, nan, 1) when they do not."""
  samples = [[float(value) for value in sample] for sample in (a, b)]
  for name, sample in zip("ab", samples):
    if len(sample) < 2 or not all(math.isfinite(value) for value in sample):
      raise ValueError(f"welch_t_test: sample {name}={sample!r} needs at least 2 values, all finite")
  means = [math.fsum(sample) / len(sample) for sample in samples]
  # The variance of each mean: the sample variance (n - 1 in the denominator) over n.
  mean_variances = [math.fsum((value - mean) ** 2 for value in sample) / (len(sample) - 1) / len(sample)
                    for sample, mean in zip(samples, means)]
  difference, variance = means[0] - means[1], sum(mean_variances)
  if variance == 0.0:
    return (math.copysign(math.inf, difference), math.nan, 0.0) if difference else (math.nan, math.nan, 1.0)
  t = difference / math.sqrt(variance)
  df = variance ** 2 / sum(v ** 2 / (len(sample) - 1) for v, sample in zip(mean_variances, samples))
  return t, df, student_t_two_sided_p(t, df)


def format_p_value(p: float) -> str:
  """``p = 0.093`` (three decimals), ``p < 0.001`` below that."""
  return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def welch_text(a, b, brief: bool = False) -> str:
  """``Welch's t = 2.10, 3.9 degrees of freedom, p = 0.105``; ``brief``, a table's: ``t = 2.10, df = 3.9, ...``."""
  t, df, p = welch_t_test(a, b)
  words = f"t = {t:.2f}, df = {df:.1f}" if brief else f"Welch's t = {t:.2f}, {df:.1f} degrees of freedom"
  return f"{words}, {format_p_value(p)}"


def block_bootstrap_difference(errors_a: np.ndarray, errors_b: np.ndarray, mask: np.ndarray, block_length: int,
                               resamples: int = 2000, seeds: int = 1) -> dict[str, np.ndarray]:
  """``{"difference", "low", "high": [H]}``: MAE(a) - MAE(b) per horizon of ``[windows, H]`` absolute errors (0 where
  not in ``mask``) and its 95% interval over ``resamples`` draws of blocks of ``block_length`` windows with each of
  the resampling seeds 0..``seeds``-1, pooled; ``"lows", "highs": [seeds, H]`` each seed's own bounds (how far the
  resampling's noise moves them)."""
  starts = np.arange(0, len(mask), block_length)
  block_errors = np.add.reduceat(errors_a - errors_b, starts, axis=0)  # [blocks, H]
  block_counts = np.add.reduceat(mask.astype(np.float64), starts, axis=0)
  resampled = []
  for seed in range(seeds):
    draws = np.random.default_rng(seed).integers(0, len(starts), size=(resamples, len(starts)))
    with np.errstate(invalid="ignore", divide="ignore"):  # a draw of unmeasured blocks only: left out (NaN)
      resampled.append(block_errors[draws].sum(axis=1) / block_counts[draws].sum(axis=1))  # [resamples, H]
  lows, highs = np.stack([np.nanpercentile(draws, [2.5, 97.5], axis=0) for draws in resampled], axis=1)
  low, high = np.nanpercentile(np.concatenate(resampled), [2.5, 97.5], axis=0)
  return {"difference": block_errors.sum(0) / block_counts.sum(0), "low": low, "high": high, "lows": lows,
          "highs": highs}
