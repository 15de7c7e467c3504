"""The quality report as text: one screen of numbers and what they mean, and the policies'
table (aligned text, or Markdown for ``--compare``'s file)."""

import math

from pileshuffle.quality import classes
from pileshuffle.quality.report import ALPHA, Report

__all__ = ["text_summary", "policies_table"]


def text_summary(report: Report) -> str:
    """One screen: the numbers and what they mean."""
    s = report.summary
    balance = s.get("balance")
    left_out = "left out: copies not matching" if balance else "duplicates left out"
    lines = [
        f"pileshuffle quality: {s['records']:,} records, {s['records_used']:,} located by hash "
        f"({s['duplicates_left_out']:,} {left_out}), {s['num_piles']} piles",
    ]
    if balance:
        lines.append(
            f"  balanced ({balance['label_field']!r}, {balance['policy']}): the order's input is "
            f"the input's {balance['input_records']:,} records with their copies "
            f"({balance['records']:,}), copies paired by their pass-1 keys"
        )
    law = "its law given the sampled input positions" if balance else "the triangular law"
    lines += [
        f"  spearman(input, output)   {s['spearman']:+.4f}   (uniform: 0 +- "
        f"{1 / math.sqrt(max(s['records_used'] - 1, 1)):.4f}; p={s['spearman_p']:.3g})",
        f"  block chi2 ({s['blocks']}x{s['blocks']})      {s['block_chi2']:.1f} on "
        f"{s['block_chi2_dof']} dof, p={s['block_chi2_p']:.3g}",
        f"  displacement KS           {s['displacement_ks']:.4f}   p={s['displacement_p']:.3g} (vs "
        f"{law})",
    ]
    if "batch_dispersion" in s:
        lines.append(
            f"  label balance per batch   dispersion {s['batch_dispersion']:.3f} over "
            f"{s['batches']:,} batches of {s['batch_size']} (binomial: 1), "
            f"p={s['batch_dispersion_p']:.3g}"
        )
    elif "note" in s.get("label", {}):
        lines.append(f"  label balance per batch   left out: {s['label']['note']}")
    verdict = "consistent with a uniform permutation" if s["uniform"] else "NOT uniform"
    lines.append(f"  verdict: {verdict} (every p-value >= {ALPHA:g})")
    if "class_shares" in s:
        lines += classes.text_lines(s["class_shares"])
    if "policies" in s:
        lines += [
            "",
            policies_table(s["policies"]),
            "  radius: how far apart in the input neighbours in the delivered order were (median, "
            f"over N; uniform {1 - 1 / math.sqrt(2):.3f}); near: neighbours within one pile's "
            f"records ({s['policies'][0]['radius_window']:,}), over the uniform share",
            "  pileshuffle's output order reproduced from its seed for "
            f"{s['pileshuffle_order_reproduced']:.1%} of the sample",
        ]
    return "\n".join(lines)


def policies_table(policies, markdown=False) -> str:
    """The policies' numbers as a table: aligned text, or a Markdown table with ``markdown``."""
    header = [
        "policy",
        "spearman",
        "block chi2 p",
        "displacement p",
        "batch dispersion",
        "epoch corr",
        "re-meet x uniform",
        "radius median",
        "near x uniform",
        "held-out acc",
        "uniform",
    ]

    def pvalue(p):
        return f"{p:.2g}" if p >= 1e-99 else "<1e-99"

    def cells(p):
        return [
            p["policy"],
            f"{p['spearman']:+.3f}",
            pvalue(p["block_chi2_p"]),
            pvalue(p["displacement_p"]),
            f"{p['batch_dispersion']:.{2 if p['batch_dispersion'] < 10 else 1}f}"
            if "batch_dispersion" in p
            else "-",
            f"{p['epoch_correlation']:+.3f}",
            f"{p['remeet_ratio']:.1f}",
            f"{p['radius_median']:.3f}",
            f"{p['radius_within_ratio']:.1f}",
            "-" if p["held_out_accuracy"] is None else f"{p['held_out_accuracy']:.3f}",
            "yes" if p["uniform"] else "no",
        ]

    rows = [cells(p) for p in policies]
    if markdown:
        return "\n".join(
            ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(r) + " |" for r in rows]
        )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  "
        + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
        for r in [header, *rows]
    )
