"""The pure-torch reference of fusedopt's AdamP (clovaai's adamp.AdamP), for golden vectors and tests. It lives in the
package (python/fusedopt/_references/adamp.py, whose docstring says how it is written and where it departs from the
original), so that the fused class's step for the params its engine cannot take runs the same update."""

from fusedopt._references.adamp import AdampReference, update

__all__ = ["AdampReference", "update"]
