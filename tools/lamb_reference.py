"""The pure-torch reference of fusedopt's LAMB (apex FusedLAMB semantics), for golden vectors and tests. It lives in
the package (python/fusedopt/_references/lamb.py, whose docstring says how it is written and where it departs from
the original), so that the fused class's step for the params its engine cannot take runs the same update."""

from fusedopt._references.lamb import LambReference, update

__all__ = ["LambReference", "update"]
