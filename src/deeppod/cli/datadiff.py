"""Comparing two dataset versions' manifests (path, label, sha256) for 'deeppod data diff'."""

from __future__ import annotations

from collections import Counter


def diff_manifests(before: list[dict], after: list[dict]) -> dict:
    """Files added and removed (by path), relabelled (same path, other label), changed
    (same path, other content), and the count per class before and after where it moved."""
    a = {r["path"]: r for r in before}
    b = {r["path"]: r for r in after}
    both = a.keys() & b.keys()
    relabelled = sorted(f"{p}: {a[p].get('label')} -> {b[p].get('label')}" for p in both
                        if a[p].get("label") != b[p].get("label"))
    changed = sorted(p for p in both if a[p].get("sha256") != b[p].get("sha256"))
    same = sum(1 for p in both if a[p].get("label") == b[p].get("label") and a[p].get("sha256") == b[p].get("sha256"))
    ca = Counter(r.get("label") for r in before)
    cb = Counter(r.get("label") for r in after)
    per_class = {str(k): (ca[k], cb[k]) for k in sorted(ca.keys() | cb.keys(), key=str) if ca[k] != cb[k]}
    return {"added": sorted(b.keys() - a.keys()), "removed": sorted(a.keys() - b.keys()), "relabelled": relabelled,
            "changed": changed, "same": same, "per_class": per_class}
