"""The pure-torch reference of fusedopt's BertAdam (torch_npu NpuFusedBertAdam semantics), for golden vectors and
tests. It lives in the package (python/fusedopt/_references/bert_adam.py, whose docstring says how it is written and
where it departs from the original), so that the fused class's step for the params its engine cannot take runs the
same update."""

from fusedopt._references.bert_adam import SCHEDULES, BertAdamReference, schedule_factor

__all__ = ["SCHEDULES", "BertAdamReference", "schedule_factor"]
