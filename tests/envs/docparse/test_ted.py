"""The vectorised Zhang–Shasha tree edit distance against hand values and the `apted`
package (an independent implementation) on random trees with random costs."""

import random

import numpy as np
import pytest
from apted import APTED, Config

from policyopt.envs.docparse.ted import _trees, _work, tree_edit_distance


class Node:
    def __init__(self, label, children=()):
        self.label = label
        self.children = list(children)


class LabelCosts(Config):
    """Costs that depend on labels only, so apted and our arrays see the same numbers."""

    def __init__(self, rename, delete, insert):
        self.r, self.d, self.i = rename, delete, insert

    def rename(self, a, b):
        return self.r[a.label][b.label]

    def delete(self, a):
        return self.d[a.label]

    def insert(self, a):
        return self.i[a.label]

    def children(self, a):
        return a.children


def postorder(root):
    """Nodes and parent indices in postorder."""
    nodes, parent = [], []

    def visit(node):
        kids = [visit(c) for c in node.children]
        nodes.append(node)
        parent.append(-1)
        for k in kids:
            parent[k] = len(nodes) - 1
        return len(nodes) - 1

    visit(root)
    return nodes, parent


def ours(t1, t2, rename, delete, insert):
    n1, p1 = postorder(t1)
    n2, p2 = postorder(t2)
    ren = np.array([[rename[a.label][b.label] for b in n2] for a in n1], dtype=float)
    return tree_edit_distance(
        p1,
        p2,
        np.array([delete[a.label] for a in n1], dtype=float),
        np.array([insert[b.label] for b in n2], dtype=float),
        ren,
    )


def random_tree(rng, size, labels):
    nodes = [Node(rng.randrange(labels))]
    deep = rng.random() < 0.5  # deep: attach near the newest nodes; else anywhere (wide)
    for _ in range(size - 1):
        parent = rng.choice(nodes[-3:] if deep else nodes)
        child = Node(rng.randrange(labels))
        parent.children.append(child)
        nodes.append(child)
    return nodes[0]


def unit(labels):
    return [[0.0 if a == b else 1.0 for b in range(labels)] for a in range(labels)], [1.0] * labels


def test_hand_examples():
    # a(b, c) -> a(b): delete c = 1. a(b, c) -> x(b, c): rename root = 1.
    rename, ones = unit(4)
    a_bc = Node(0, [Node(1), Node(2)])
    assert ours(a_bc, Node(0, [Node(1)]), rename, ones, ones) == 1.0
    assert ours(a_bc, Node(3, [Node(1), Node(2)]), rename, ones, ones) == 1.0
    # Path a-b-c vs star a(b, c): a mapping keeps at most a and one of b, c (ancestry),
    # so delete one node and insert one: 2.
    path = Node(0, [Node(1, [Node(2)])])
    assert ours(path, a_bc, rename, ones, ones) == 2.0
    # Deleting the inner node b of a(b(c, d)) promotes c, d: a(b(c, d)) -> a(c, d) costs 1.
    assert (
        ours(
            Node(0, [Node(1, [Node(2), Node(3)])]), Node(0, [Node(2), Node(3)]), rename, ones, ones
        )
        == 1.0
    )
    # Empty trees: all insertions.
    assert tree_edit_distance([], [2, 2, -1], np.zeros(0), np.ones(3), np.zeros((0, 3))) == 3.0


def test_random_trees_with_random_costs_match_apted():
    rng = random.Random(0)
    for _ in range(150):
        labels = rng.randint(1, 4)
        t1 = random_tree(rng, rng.randint(1, 14), labels)
        t2 = random_tree(rng, rng.randint(1, 14), labels)
        rename = [
            [0.0 if a == b else rng.uniform(0.1, 2.0) for b in range(labels)] for a in range(labels)
        ]
        delete = [rng.uniform(0.5, 1.5) for _ in range(labels)]
        insert = [rng.uniform(0.5, 1.5) for _ in range(labels)]
        expected = APTED(t1, t2, LabelCosts(rename, delete, insert)).compute_edit_distance()
        assert ours(t1, t2, rename, delete, insert) == pytest.approx(expected, abs=1e-9)


def test_larger_random_trees_match_apted():
    rng = random.Random(1)
    rename, ones = unit(3)
    for _ in range(12):
        t1, t2 = random_tree(rng, rng.randint(25, 50), 3), random_tree(rng, rng.randint(25, 50), 3)
        expected = APTED(t1, t2, LabelCosts(rename, ones, ones)).compute_edit_distance()
        assert ours(t1, t2, rename, ones, ones) == pytest.approx(expected, abs=1e-9)


def test_mirroring_is_chosen_for_a_heavy_right_subtree_and_keeps_the_value():
    # root(thead(tr(4 leaves)), tbody(3 × tr(4 leaves))): the left decomposition makes tbody a
    # big keyroot; the mirrored tree has less work, and the distance must not change.
    def table(labels):
        def row():
            return Node(2, [Node(labels.pop()) for _ in range(4)])

        return Node(0, [Node(1, [row()]), Node(1, [row() for _ in range(3)])])

    rng = random.Random(2)
    t1 = table([rng.randrange(3, 6) for _ in range(16)])
    t2 = table([rng.randrange(3, 6) for _ in range(16)])
    tree, mirror = _trees(tuple(postorder(t1)[1]))
    assert _work(mirror, mirror) < _work(tree, tree)
    rename, ones = unit(6)
    expected = APTED(t1, t2, LabelCosts(rename, ones, ones)).compute_edit_distance()
    assert ours(t1, t2, rename, ones, ones) == pytest.approx(expected, abs=1e-9)


def test_bad_inputs_name_the_problem():
    with pytest.raises(ValueError, match="postorder"):
        tree_edit_distance([-1, 0], [-1], np.ones(2), np.ones(1), np.ones((2, 1)))
    with pytest.raises(ValueError, match="cost shapes"):
        tree_edit_distance([-1], [-1], np.ones(2), np.ones(1), np.ones((1, 1)))
