"""Grouped placement: a document's chunks stay inside the group (expert) most of them point to."""

import numpy as np

from index.placement import leakage, owner_groups, place


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_a_document_goes_whole_to_its_majority_group() -> None:
    # Four lists on the axes; lists 0, 1 belong to group 10, lists 2, 3 to group 20.
    centroids = np.eye(4, dtype=np.float32)
    groups = np.array([10, 10, 20, 20])
    # Document 1: three chunks near lists 0/1, one near list 2 (it would leak under plain IVF).
    x = unit(np.array([[1, 0.1, 0, 0], [0.1, 1, 0, 0], [1, 0, 0.2, 0], [0, 0.3, 1, 0]], dtype=np.float32))
    owners = np.array([1, 1, 1, 1])
    assert owner_groups(x, owners, centroids, groups) == {1: 10}
    placed = place(x, owners, centroids, groups)
    assert placed.tolist() == [0, 1, 0, 1]  # the stray chunk goes to the nearest list *of group 10*
    plain = np.argmax(x @ centroids.T, axis=1)
    assert leakage(owners, plain, groups) == 0.25
    assert leakage(owners, placed, groups) == 0.0


def test_unowned_lists_and_ties() -> None:
    centroids = np.eye(3, dtype=np.float32)
    groups = np.array([-1, 5, 6])
    x = unit(np.array([[1, 0, 0.1], [1, 0.1, 0], [0, 1, 0], [0, 0.2, 1]], dtype=np.float32))
    owners = np.array([7, 7, 8, 8])
    # Document 7 points at the unowned list: it stays in unowned lists. Document 8 ties 1-1:
    # the larger summed similarity (list 1's chunk is nearer its centroid) wins.
    assert owner_groups(x, owners, centroids, groups) == {7: -1, 8: 5}
    assert place(x, owners, centroids, groups).tolist() == [0, 0, 1, 1]
    assert place(np.zeros((0, 3), dtype=np.float32), np.zeros(0, dtype=np.int64), centroids, groups).size == 0


def test_pinned_documents_go_to_their_group_and_a_reserved_group_takes_no_other() -> None:
    centroids = np.eye(4, dtype=np.float32)
    groups = np.array([10, 10, 20, 30])  # group 30: an expert defined by documents
    x = unit(np.array([[1, 0, 0, 0.1], [0, 0.1, 0, 1], [0, 0, 0.2, 1], [0.1, 0, 0, 1]], dtype=np.float32))
    owners = np.array([1, 2, 2, 3])  # document 2 is pinned to 30; 3 sits nearest list 3 but is not
    placed = place(x, owners, centroids, groups, {2: 30}, {30})
    assert placed[1:3].tolist() == [3, 3]  # pinned: the nearest list of its group, whatever the vote
    assert groups[placed[3]] != 30 and groups[placed[0]] == 10  # reserved: the others vote elsewhere
    assert place(x, owners, centroids, groups, {2: 99}).tolist() == place(x, owners, centroids, groups).tolist()
