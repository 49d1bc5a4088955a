"""Exact ordered tree edit distance (Zhang & Shasha, 1989), vectorised with numpy.

Trees are given in postorder by their parent arrays and costs as arrays, so one function serves
PubTabNet's TEDS (unit costs) and DocPO's weighted variant. The result is the exact minimum
edit cost, the same value APTED gives; only the order of the work differs, so that numpy does
it in few calls:

- td(i, j) when i or j is a single node has a closed form, done for all leaves at once;
- the other keyroot pairs run Zhang–Shasha's forest recurrence one row at a time, each row
  vectorised over a block of keyroot pairs. Keyroots are grouped by nesting level, and pairs
  of one block never read each other's results. A block runs along the side with fewer rows
  (the recurrence is symmetric), and both trees are mirrored when the right-path
  decomposition has less work (e.g. a table whose `thead` comes first);
- along a row, the insertion chain fd(x, y) = min(c(y), fd(x, y−1) + ins(y)) is a prefix
  minimum: fd(x, y) = min_{y' ≤ y} (c(y') − Σ_{≤y'} ins) + Σ_{≤y} ins.

Zhang–Shasha, for keyroots k1, k2 and i ∈ T1[k1], j ∈ T2[k2] (l = leftmost leaf):
    fd(i, j) = min(fd(i−1, j) + del(i),  fd(i, j−1) + ins(j),
                   fd(i−1, j−1) + ren(i, j)            if l(i) = l(k1) and l(j) = l(k2)
                   fd(l(i)−1, l(j)−1) + td(i, j)       otherwise)
and td(i, j) = fd(i, j) in the first case.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import lru_cache

import numpy as np

# Most float64 cells one block's forest table may hold before the block is split.
_BLOCK_CELLS = 1 << 22


def tree_edit_distance(
    parent1: Sequence[int],
    parent2: Sequence[int],
    delete: np.ndarray,
    insert: np.ndarray,
    rename: np.ndarray,
) -> float:
    """Minimum cost of editing tree 1 into tree 2.

    parent1, parent2: postorder parent index of each node (-1 for the root, which is last).
    delete [n1], insert [n2]: cost of deleting a node of tree 1 / inserting one of tree 2.
    rename [n1, n2]: cost of mapping node i of tree 1 onto node j of tree 2. Costs >= 0.
    """
    n1, n2 = len(parent1), len(parent2)
    delete = np.asarray(delete, dtype=np.float64)
    insert = np.asarray(insert, dtype=np.float64)
    rename = np.asarray(rename, dtype=np.float64)
    if delete.shape != (n1,) or insert.shape != (n2,) or rename.shape != (n1, n2):
        raise ValueError(
            f"cost shapes {delete.shape}, {insert.shape}, {rename.shape} do not match trees "
            f"of {n1} and {n2} nodes"
        )
    if n1 == 0 or n2 == 0:
        return float(delete.sum() + insert.sum())
    tree1, mirror1 = _trees(tuple(parent1))
    tree2, mirror2 = _trees(tuple(parent2))
    if _work(mirror1, mirror2) < _work(tree1, tree2):
        tree1, tree2 = mirror1, mirror2
        delete, insert = delete[tree1.order], insert[tree2.order]
        rename = rename[np.ix_(tree1.order, tree2.order)]
    td = np.zeros((n1, n2))
    _single_node_pairs(td, tree1.left, tree2.left, delete, insert, rename)
    for keys1 in tree1.buckets():
        for keys2 in tree2.buckets():
            if tree1.rows(keys1) <= tree2.rows(keys2):
                _keyroot_block(td, keys1, keys2, tree1.left, tree2.left, delete, insert, rename)
            else:  # same recurrence with the trees' roles swapped: fewer, wider rows
                _keyroot_block(td.T, keys2, keys1, tree2.left, tree1.left, insert, delete, rename.T)
    return float(td[n1 - 1, n2 - 1])


@lru_cache(maxsize=1024)  # a reference is scored against every rollout of its group
def _trees(parent: tuple[int, ...]) -> tuple[_Tree, _Tree]:
    """The tree and its mirror image."""
    tree = _Tree(parent)
    return tree, tree.mirrored()


class _Tree:
    """Leftmost leaves, keyroots and their nesting levels of a postorder parent array.

    A keyroot is the highest node with its leftmost leaf. A non-leaf keyroot's level is
    1 + the highest level of the keyroots strictly inside its subtree (leaves: 0), so keyroots
    of equal level have disjoint subtrees. `order[new] = old` maps back after mirroring.
    """

    def __init__(self, parent: Sequence[int], order: np.ndarray | None = None) -> None:
        n = len(parent)
        if parent[n - 1] != -1 or any(not (i < p < n) for i, p in enumerate(parent[:-1])):
            raise ValueError("parent array must be in postorder: parent[i] > i, root last = -1")
        self.parent = list(parent)
        self.order = np.arange(n) if order is None else order
        left = list(range(n))
        has_child = [False] * n
        for i in range(n - 1):  # children precede parents; the first child seen is leftmost
            p = parent[i]
            if not has_child[p]:
                has_child[p] = True
                left[p] = left[i]
        keyroot_of_left = {leaf: i for i, leaf in enumerate(left)}  # the highest node wins
        level = [-1] * n
        inside = [0] * n  # highest keyroot level seen below each node
        for i in range(n):
            if keyroot_of_left[left[i]] == i:
                level[i] = 1 + inside[i] if has_child[i] else 0
            p = parent[i]
            if p >= 0:
                inside[p] = max(inside[p], level[i], inside[i])
        self.left = np.asarray(left, dtype=np.int64)
        self.level = np.asarray(level, dtype=np.int64)

    def mirrored(self) -> _Tree:
        """The tree with every node's children reversed, renumbered in postorder."""
        n = len(self.parent)
        children: list[list[int]] = [[] for _ in range(n)]
        for i, p in enumerate(self.parent[:-1]):
            children[p].append(i)
        order: list[int] = []
        new_parent = [-1] * n
        stack = [(n - 1, children[n - 1][:])]  # visit the last child first
        while stack:
            node, pending = stack[-1]
            if pending:
                kid = pending.pop()
                stack.append((kid, children[kid][:]))
                continue
            stack.pop()
            order.append(node)
        new_index = {old: new for new, old in enumerate(order)}
        for new, old in enumerate(order[:-1]):
            new_parent[new] = new_index[self.parent[old]]
        return _Tree(new_parent, self.order[np.asarray(order)])

    def rows(self, keys: list[int]) -> int:
        """Padded subtree size of a bucket of keyroots."""
        return max(self._size(k) for k in keys)

    def buckets(self) -> Iterator[list[int]]:
        """Non-leaf keyroots level by level (a level reads td of lower levels only), in
        buckets of similar size so padding at most doubles the work."""
        for lev in range(1, int(self.level.max()) + 1):
            keys = sorted(np.flatnonzero(self.level == lev).tolist(), key=self._size)
            bucket: list[int] = []
            for k in keys:
                if bucket and self._size(k) > 2 * self._size(bucket[0]):
                    yield bucket
                    bucket = []
                bucket.append(k)
            if bucket:
                yield bucket

    def _size(self, k: int) -> int:
        return int(k - self.left[k]) + 1


def _work(tree1: _Tree, tree2: _Tree) -> int:
    """Row iterations the block loop will run: the cost that dominates in practice."""
    b1 = [tree1.rows(b) for b in tree1.buckets()]
    b2 = [tree2.rows(b) for b in tree2.buckets()]
    return sum(min(r1, r2) for r1 in b1 for r2 in b2)


def _single_node_pairs(td, left1, left2, delete, insert, rename) -> None:
    """td(i, j) when j (or i) is a leaf: all of the other subtree is deleted (inserted) except
    at most one node m, which is renamed onto the leaf:
        td(i, leaf j) = Σ_{m∈T1[i]} del(m) + min(ins(j), min_{m∈T1[i]} (ren(m, j) − del(m)))."""
    n1, n2 = len(left1), len(left2)
    leaves1 = np.flatnonzero(left1 == np.arange(n1))
    leaves2 = np.flatnonzero(left2 == np.arange(n2))
    best = _subtree_min(rename[:, leaves2] - delete[:, None], left1, axis=0)
    td[:, leaves2] = _subtree_sums(delete, left1)[:, None] + np.minimum(insert[leaves2], best)
    best = _subtree_min(rename[leaves1, :] - insert[None, :], left2, axis=1)
    td[leaves1, :] = _subtree_sums(insert, left2)[None, :] + np.minimum(
        delete[leaves1][:, None], best
    )


def _subtree_sums(cost: np.ndarray, left: np.ndarray) -> np.ndarray:
    """Σ cost over each subtree; in postorder the subtree of i is the range [l(i), i]."""
    prefix = np.concatenate([[0.0], np.cumsum(cost)])
    return prefix[np.arange(len(left)) + 1] - prefix[left]


def _subtree_min(values: np.ndarray, left: np.ndarray, axis: int) -> np.ndarray:
    """min of `values` over each subtree's index range [l(i), i] along `axis`."""
    n = len(left)
    padded = np.concatenate([values, values.take([0], axis=axis)], axis=axis)
    bounds = np.empty(2 * n, dtype=np.int64)
    bounds[0::2] = left
    bounds[1::2] = np.arange(n) + 1
    # reduceat reduces over [bounds[2k], bounds[2k+1]); the odd slots are discarded.
    return np.minimum.reduceat(padded, bounds, axis=axis).take(np.arange(0, 2 * n, 2), axis=axis)


def _keyroot_block(td, keys1, keys2, left1, left2, delete, insert, rename) -> None:
    """Zhang–Shasha for every pair (k1, k2) of a block at once, split so the forest table
    stays under `_BLOCK_CELLS`; writes td(i, j) for i, j on the leftmost paths of k1, k2."""
    size2 = int(max(k - left2[k] for k in keys2)) + 1
    size1 = int(max(k - left1[k] for k in keys1)) + 1
    per_pair = (size1 + 1) * (size2 + 1)
    chunk1 = max(1, _BLOCK_CELLS // (per_pair * len(keys2)))
    for start in range(0, len(keys1), chunk1):
        _pairs(td, keys1[start : start + chunk1], keys2, left1, left2, delete, insert, rename)


def _pairs(td, keys1, keys2, left1, left2, delete, insert, rename) -> None:
    """fd[x, b1, b2, y]: pair (b1, b2)'s forest distance between the first x nodes of
    T1[k1] and the first y nodes of T2[k2], computed row x by row x for all pairs at once."""
    k1, k2 = np.asarray(keys1), np.asarray(keys2)
    b1, b2 = len(k1), len(k2)
    size1 = int((k1 - left1[k1]).max()) + 1
    size2 = int((k2 - left2[k2]).max()) + 1
    # Row x of pair b is node l(k1_b) + x, clipped to k1_b as padding; same for columns.
    i_node = np.minimum(left1[k1][:, None] + np.arange(size1), k1[:, None])  # [b1, R]
    j_node = np.minimum(left2[k2][:, None] + np.arange(size2), k2[:, None])  # [b2, C]
    row_ok = np.arange(size1) < (k1 - left1[k1] + 1)[:, None]
    col_ok = np.arange(size2) < (k2 - left2[k2] + 1)[:, None]
    on_path1 = left1[i_node] == left1[k1][:, None]
    on_path2 = left2[j_node] == left2[k2][:, None]
    # "Otherwise" case: fd row of the forest before l(i), and flat column (in a row seen as
    # [b2 · (C+1)]) of the forest before l(j).
    far_row = left1[i_node] - left1[k1][:, None]
    far_col = np.arange(b2)[:, None] * (size2 + 1) + left2[j_node] - left2[k2][:, None]

    rows = i_node.T[:, :, None, None]  # [R, b1, 1, 1]
    cols = j_node[None, None]  # [1, 1, b2, C]
    near = on_path1.T[:, :, None, None] & on_path2[None, None]  # [R, b1, b2, C]
    # Pairs of one block never read each other's td, so "otherwise" costs can be read now.
    diag_cost = np.where(near, rename[rows, cols], td[rows, cols])
    del_rows = (delete[i_node] * row_ok).T  # [R, b1]
    del_prefix = np.concatenate([np.zeros((1, b1)), np.cumsum(del_rows, axis=0)])
    ins_cells = np.where(col_ok, insert[j_node], 0.0)
    ins_prefix = np.concatenate([np.zeros((b2, 1)), np.cumsum(ins_cells, axis=1)], axis=1)

    fd = np.empty((size1 + 1, b1, b2, size2 + 1))
    fd[0] = ins_prefix
    batch = np.arange(b1)
    single = b1 == 1
    for x in range(size1):
        prev, row = fd[x], fd[x + 1]
        diag = prev[:, :, :-1] + diag_cost[x]  # near: fd(i−1, j−1) + ren(i, j)
        base = fd[far_row[0, x]] if single else fd[far_row[:, x], batch]
        far = base.reshape(b1, -1)[:, far_col]  # fd(l(i)−1, l(j)−1)
        far += diag_cost[x]  # + td(i, j)
        np.copyto(diag, far, where=~near[x])
        np.minimum(prev[:, :, 1:] + del_rows[x, :, None, None], diag, out=row[:, :, 1:])
        row[:, :, 0] = del_prefix[x + 1, :, None]
        row -= ins_prefix
        np.minimum.accumulate(row, axis=2, out=row)
        row += ins_prefix
    done = near & row_ok.T[:, :, None, None] & col_ok[None, None]
    values = fd[1:, :, :, 1:]
    td[np.broadcast_to(rows, done.shape)[done], np.broadcast_to(cols, done.shape)[done]] = values[
        done
    ]
