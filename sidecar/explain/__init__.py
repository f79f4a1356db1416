"""Rule-based explanations of RAG answers: exact minimal retention and omission rules.

For a query with retrieved sources, a black-box LLM answers with any subset of the
sources kept; a predicate judges each answer. :func:`explain` mines the minimal rules
with :class:`MonoMiner` or :class:`DualMiner` over a pruned subset lattice;
:func:`run_explain` does it all for one :class:`ExplainRequest` (``sidecar explain``).
"""

from sidecar.explain._client import AnswerCache, BlackBox, ChatCompletionsClient
from sidecar.explain._evaluate import EvaluatorStats, SubsetEvaluator
from sidecar.explain._explain import Explanation, explain
from sidecar.explain._lattice import (
    RULE_TYPES,
    RuleType,
    brute_force_rules,
    full_mask,
    members,
    to_mask,
)
from sidecar.explain._local import LocalSmolLM2, local_model_available
from sidecar.explain._miner import DualMiner, FamilyResult, MiningReport, MonoMiner
from sidecar.explain._predicates import Contains, Predicate, parse_predicate
from sidecar.explain._prompt import (
    Messages,
    Source,
    build_messages,
    load_sources,
    sources_from_records,
)
from sidecar.explain._run import ExplainRequest, ExplainRun, ProgressBar, run_explain

__all__ = [
    "RULE_TYPES",
    "AnswerCache",
    "BlackBox",
    "ChatCompletionsClient",
    "Contains",
    "DualMiner",
    "EvaluatorStats",
    "ExplainRequest",
    "ExplainRun",
    "Explanation",
    "FamilyResult",
    "LocalSmolLM2",
    "Messages",
    "MiningReport",
    "MonoMiner",
    "Predicate",
    "ProgressBar",
    "RuleType",
    "Source",
    "SubsetEvaluator",
    "brute_force_rules",
    "build_messages",
    "explain",
    "full_mask",
    "load_sources",
    "local_model_available",
    "members",
    "parse_predicate",
    "run_explain",
    "sources_from_records",
    "to_mask",
]
