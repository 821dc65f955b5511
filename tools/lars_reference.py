"""The pure-torch reference of fusedopt's LARS (apex LARC around torch.optim.SGD), for golden vectors and tests. It
lives in the package (python/fusedopt/_references/lars.py, whose docstring says how it is written and where it
departs from the original), so that the fused class's step for the params its engine cannot take runs the same
update."""

from fusedopt._references.lars import LarcSGD, LarsReference, update

__all__ = ["LarcSGD", "LarsReference", "update"]
