"""The layers the ``tp`` strategy swaps in where the group set up push sites: no all-reduce launch at decode sizes.

``push_layers`` (``TensorParallelStrategy.prepare_model``, on every rank once the weights are loaded) walks
the model's modules in order and gives the vocabulary-parallel embedding and every row-parallel layer that
can push (no bias, a linear method with the decode GEMV) the next push site, replacing the layer in its
parent with a module that holds it: the same parameters, nothing copied. The same model on every rank, so
the same layer gets the same site on every rank.

A replacement takes the pushed path where the core layer would run the decode GEMV (CUDA, 1-2 rows: the
dense method's ``uses_gemv``) or, for the embedding, on CUDA token ids of up to a site's rows; elsewhere it calls
the layer it holds, which computes and all-reduces as always. Pushed, a row-parallel layer's output is
added as the site's mode says (``pushed_sums.py``): ``gemv`` by the pushing GEMV's own last programs, ``sum``
by a small kernel after it, ``all_reduce`` by one kernel that pushes the layer's stored output and adds.
The embedding looks up, zeroes the tokens its rank does not hold, pushes and adds in one launch in every mode.
"""

from __future__ import annotations

import logging

import torch
from infer_core.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from infer_core.layers.linear import RowParallelLinear
from infer_core.layers.unquantized import UnquantizedLinearMethod
from torch import nn

from infer_parallel_tp.push_all_reduce import all_reduce_pushed, lookup_all_reduce
from infer_parallel_tp.push_sites import PushLayout, PushSites
from infer_parallel_tp.push_target import PushTarget
from infer_parallel_tp.pushed_sums import sum_pushed
from infer_parallel_tp.pushing_gemv import gemv_push

logger = logging.getLogger(__name__)


class PushedRowParallelLinear(nn.Module):
    """A row-parallel layer whose decode GEMV pushes its partial sums into ``target`` instead of all-reducing."""

    def __init__(self, layer: RowParallelLinear, target: PushTarget, sites: PushSites, site: int) -> None:
        super().__init__()
        self.layer = layer  # its parameters, method and all-reduce: the path of every other batch
        self.target = target
        self.sites = sites  # counts the pushes of each site (the communicator's describe())
        self.site = site

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layer, target = self.layer, self.target
        if x.dim() != 2 or x.shape[0] > target.max_rows or not layer.method.uses_gemv(layer, x):
            return layer(x)
        self.sites.pushes[self.site] += 1
        if target.mode == "gemv":  # the pushing GEMV's last programs add every rank's partial sums
            return gemv_push(x, layer.weight, target, add=True)
        if target.mode == "sum":
            gemv_push(x, layer.weight, target)
            return sum_pushed(target, x.shape[0])
        return all_reduce_pushed(layer.method.apply(layer, x, None), target)  # "all_reduce"


class PushedVocabEmbedding(nn.Module):
    """The vocabulary-parallel embedding looked up and all-reduced in one launch through ``target``."""

    def __init__(self, embedding: VocabParallelEmbedding, target: PushTarget, sites: PushSites, site: int) -> None:
        super().__init__()
        self.embedding = embedding  # its table (tied to the LM head or not) and its masked lookup + all-reduce
        self.target = target
        self.sites = sites
        self.site = site

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if input_ids.dim() != 1 or not input_ids.is_cuda or not 0 < input_ids.shape[0] <= self.target.max_rows:
            return self.embedding(input_ids)
        self.sites.pushes[self.site] += 1
        e = self.embedding
        return lookup_all_reduce(input_ids, e.weight, e.vocab_start, e.vocab_end, self.target)


def pushes(module: nn.Module, layout: PushLayout) -> bool:
    """Whether ``module`` gets a push site: the embedding (not the LM head, which all-gathers), and a row-parallel
    layer without bias whose linear method runs the decode GEMV, both with outputs of the sites' size and dtype."""
    if isinstance(module, VocabParallelEmbedding) and not isinstance(module, ParallelLMHead):
        return module.weight.dtype == layout.dtype and module.weight.shape[1] == layout.hidden_size
    if not isinstance(module, RowParallelLinear) or module.bias is not None:
        return False
    weight = getattr(module, "weight", None)
    return (isinstance(module.method, UnquantizedLinearMethod) and weight is not None
            and weight.dtype == layout.dtype and module.output_sizes == [layout.hidden_size])


def push_layers(model: nn.Module, sites: PushSites) -> list[str]:
    """Replace, in module order, each module that ``pushes`` with its pushing module, one site each, while sites
    last; the names of the modules replaced."""
    found = [(name, module) for name, module in model.named_modules() if pushes(module, sites.layout)]
    replaced = []
    for name, module in found:
        taken = sites.take()
        if taken is None:
            logger.info("all %d push sites are taken; %s and the layers after it all-reduce", sites.layout.num_sites,
                        name)
            break
        site, target = taken
        kind = PushedVocabEmbedding if isinstance(module, VocabParallelEmbedding) else PushedRowParallelLinear
        parent, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(parent), attribute, kind(module, target, sites, site))
        replaced.append(name)
    log = logger.info if sites.rank == 0 else logger.debug
    log("pushed partial sums: %d layers push (added by %s); %d push sites", len(replaced), sites.layout.mode,
        sites.layout.num_sites)
    return replaced
