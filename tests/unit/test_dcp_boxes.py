"""DCP boxes: a flat range [lo, hi) of a tensor as at most 2·ndim − 1 rectangular boxes, the
``Boxes`` leaves of a rank's pieces, and a save in one layout read back in another (DCP without a
process group: ``no_dist=True``)."""

import itertools
import math
import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

from fsdp_mini.checkpoint.dcp_boxes import BoxLoader, Boxes, BoxSaver, add_boxes, boxes


@pytest.mark.parametrize("lo, hi, shape, expected", [
    (2, 9, (3, 4), [((0, 2), (1, 2), 2), ((1, 0), (1, 4), 4), ((2, 0), (1, 1), 8)]),
    (0, 6, (3, 4), [((0, 0), (1, 4), 0), ((1, 0), (1, 2), 4)]),     # w (3, 4), N = 2, rank 0
    (6, 12, (3, 4), [((1, 2), (1, 2), 6), ((2, 0), (1, 4), 8)]),    # ... rank 1
    (0, 12, (3, 4), [((0, 0), (3, 4), 0)]),                         # the whole tensor
    (4, 12, (3, 4), [((1, 0), (2, 4), 4)]),                         # whole rows: one box
    (5, 7, (3, 4), [((1, 1), (1, 2), 5)]),                          # inside one row
    (2, 5, (10,), [((2,), (3,), 2)]),
    (0, 1, (), [((), (), 0)]),                                      # a scalar
    (5, 5, (3, 4), []), (7, 3, (3, 4), []),                         # nothing
    # 3-D, elements 5..18 of (2, 3, 4): rows (0,1) from 1, (0,2) whole, (1,0) whole, (1,1) to 3
    (5, 19, (2, 3, 4), [((0, 1, 1), (1, 1, 3), 5), ((0, 2, 0), (1, 1, 4), 8),
                        ((1, 0, 0), (1, 1, 4), 12), ((1, 1, 0), (1, 1, 3), 16)]),
])
def test_boxes(lo, hi, shape, expected):
    assert boxes(lo, hi, shape) == expected


def elements(lo, hi, shape):
    """The flat indices the boxes of [lo, hi) cover, in order, read off torch's own indexing."""
    index = torch.arange(math.prod(shape)).view(shape)
    out = []
    for offsets, sizes, first in boxes(lo, hi, shape):
        part = index[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))].reshape(-1)
        assert part[0].item() == first
        out += part.tolist()
    return out


@pytest.mark.parametrize("shape", [(7,), (3, 4), (4, 1), (1, 5), (2, 3, 4), (2, 1, 3, 2)])
def test_boxes_cover_every_range_exactly_and_are_few(shape):
    numel = math.prod(shape)
    for lo, hi in itertools.combinations(range(numel + 1), 2):
        assert elements(lo, hi, shape) == list(range(lo, hi))
        assert len(boxes(lo, hi, shape)) <= 2 * len(shape) - 1


def piece(lo, hi, shape):
    return SimpleNamespace(lo=lo, hi=hi, shape=shape)


def test_add_boxes_views_the_rank_piece():
    flat = torch.arange(12.)[6:12].clone()      # rank 1's piece of w (3, 4) at N = 2
    into = {}
    add_boxes(into, "w", flat, piece(6, 12, (3, 4)), writes_empty=False)
    leaf = into["w"]
    assert isinstance(leaf, Boxes) and leaf.shape == (3, 4) and leaf.dtype == torch.float32
    assert {o: (s, t.tolist()) for o, (s, t) in leaf.parts.items()} == {
        (1, 2): ((1, 2), [[6., 7.]]), (2, 0): ((1, 4), [[8., 9., 10., 11.]])}
    assert leaf.parts[(2, 0)][1].data_ptr() == flat[2:].data_ptr()   # no copy


def test_add_boxes_of_an_empty_piece_and_an_empty_tensor():
    into = {}
    add_boxes(into, "w", torch.empty(0), piece(0, 0, (3, 4)), writes_empty=True)
    assert into["w"].parts == {}                 # a rank holding none of w lists no box
    add_boxes(into, "e", torch.empty(0), piece(0, 0, (0, 4)), writes_empty=True)
    [(offsets, (sizes, t))] = into["e"].parts.items()
    assert offsets == (0, 0) and sizes == (0, 4) and t.shape == (0, 4)
    add_boxes(into, "f", torch.empty(0), piece(0, 0, (0, 4)), writes_empty=False)
    assert into["f"].parts == {}


def save_load(saved, dest, path):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(saved, storage_writer=FileSystemWriter(path), planner=BoxSaver(), no_dist=True)
        loader = BoxLoader()
        dcp.load(dest, storage_reader=FileSystemReader(path), planner=loader, no_dist=True)
    return loader


@pytest.mark.parametrize("save_n, load_n", [(2, 3), (3, 2), (1, 4), (4, 1), (5, 2)])
def test_saved_in_n_pieces_read_back_in_m(save_n, load_n, tmp_path):
    w = torch.arange(12.).view(3, 4)
    saved = {"step": torch.tensor(7)}
    for r in range(save_n):       # every rank's piece, as save_n ranks would write them
        k = -(-12 // save_n)
        lo, hi = min(r * k, 12), min((r + 1) * k, 12)
        add_boxes(saved, "w", w.reshape(-1)[lo:hi].clone(), piece(lo, hi, (3, 4)), lo == 0)
    k = -(-12 // load_n)
    dest, staging = {"step": torch.tensor(0)}, []
    for r in range(load_n):
        lo, hi = min(r * k, 12), min((r + 1) * k, 12)
        staging.append(torch.full((hi - lo,), -1.))
        add_boxes(dest, "w", staging[-1], piece(lo, hi, (3, 4)), writes_empty=False)
    save_load(saved, dest, str(tmp_path))
    assert torch.cat(staging).tolist() == list(range(12)) and dest["step"].item() == 7


def test_values_stored_as_bytes_land_in_loaded(tmp_path):
    loader = save_load({"lr": 0.5, "name": "adam"}, {"lr": None, "name": None}, str(tmp_path))
    assert loader.loaded == {"lr": 0.5, "name": "adam"}
