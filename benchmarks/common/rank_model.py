"""The cost model of a batch on P ranks (``parallel_model.py``), from each block's counted figures.

What a rank does and what it pays to meet the others: each block at its share (``rank_s``: its
seconds on m/P points, or on its rows where it moves to rows), the driver on m/P points, and
each block's collectives at this machine's latency for their size; the W-blocks that an unchecked
round solves by layer (``layer_split``) at their one-rank seconds, the batch waiting for the
rank that solves the most of them. Beside it, the same model at the machine's contention
(``contended``): each rank's work slowed as much as the ceiling's P processes at once slow each
other. Docs page "Training in parallel".
"""

from .latency import latency


def model(figures, batch_s, share, share_s, table, P, plan):
    """The modelled P-rank batch and its parts (seconds); a block's ``rank_s``, where not moved
    to rows, is set to its compute in the epoch of batches of m/P (``share``). The W-blocks of
    ``plan`` (``layer_split.owners``: each solved whole by one rank) take their one-rank compute,
    and the batch the most that one rank solves of them (the others wait for it), with the
    split's one gather of the columns that other ranks solve (a rank's share) and two of the W's
    and reports."""
    blocks = sum(f["compute_s"] for f in figures.values())
    by_layer = {f"W_{l}": r for l, r in plan.items()}
    for key, f in figures.items():
        if key in by_layer:
            f["rank_s"], f["as_on_ranks"], f["layer_rank"] = f["compute_s"], 0.0, by_layer[key]
        elif not f["moved"]:
            f["rank_s"], f["as_on_ranks"] = share[key]["compute_s"], share[key]["as_on_ranks"]
    loads = [sum(figures[k]["compute_s"] for k in by_layer if by_layer[k] == r) for r in range(P)]
    rest = sum(f["rank_s"] for k, f in figures.items() if k not in by_layer)
    rank_driver = max(0.0, share_s - sum(f["compute_s"] for f in share.values()))
    comm = sum(f["collectives"] * latency(table, f["bytes"] / max(f["collectives"], 1))
               for k, f in figures.items() if k not in by_layer)  # fmt: skip
    split = 0.0
    if by_layer:  # a gather moves every rank's part at the largest's size; reports ~1 KB
        sent = max(sum(figures[k]["column_bytes"] / P for k in by_layer if by_layer[k] != r)
                   for r in range(P))  # fmt: skip
        Ws = max(sum(figures[k]["w_bytes"] for k in by_layer if by_layer[k] == r) for r in range(P))
        split = latency(table, sent) + latency(table, Ws) + latency(table, 1024)
    return dict(
        blocks_s=blocks, driver_s=max(0.0, batch_s - blocks), rank_blocks_s=rest + max(loads),
        rank_driver_s=rank_driver, comm_s=comm + split, layer_split_comm_s=split,
        layer_loads_s=loads, batch_P_s=rest + max(loads) + rank_driver + comm + split,
    )  # fmt: skip


def contended(m, slowdown):
    """The modelled P-rank batch (``model``'s ``m``) with a rank's work, its blocks and its
    driver, slowed by ``slowdown`` (the ceiling's: an epoch of P processes at once against one
    alone), its communication as measured: seconds."""
    return (m["rank_blocks_s"] + m["rank_driver_s"]) * slowdown + m["comm_s"]
