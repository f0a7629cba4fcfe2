"""Keyframe retrieval by appearance: which keyframes may show the place that a frame shows.

Place recognition and relocalisation match a frame's descriptors against candidate map points. Matched
against every point, a query costs the whole map, and on long footage the map grows without end: on
`bench.loop_closures`' eight laps of one room, place recognition's CPU per lap grew with the points
(0.22 -> 0.81 CPU-s a lap from 1.9k to 12k points) while it recognised fewer places (among more
look-alikes, fewer best matches pass the ratio test). ORB-SLAM asks a keyframe database first (DBoW2:
a bag of binary words per keyframe, an inverted index) and matches only the points of the keyframes it
returns; here the same. Nothing may be downloaded at run time, so the vocabulary is learned from the
footage itself: once `vocabulary_descriptors` keyframe descriptors are in, `words` words are drawn from
them by k-majority clustering (binary k-means: a word is the bitwise majority of its descriptors) and
every keyframe becomes a bag of words. A query scores the keyframes that share its words, through the
inverted index, by idf-weighted histogram intersection of the normalised word counts, so its cost grows
with the postings of its words rather than with the map's points.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

__all__ = ["KeyframeIndex", "RetrievalOptions", "k_majority"]


@dataclass(frozen=True)
class RetrievalOptions:
    """Knobs of keyframe retrieval."""

    # candidate sets of at most this many map points are matched whole, without retrieval
    exhaustive_max_points: int = 5000
    # vocabulary size, words
    words: int = 1024
    # the vocabulary is learned once this many keyframe descriptors are in (until then, no retrieval)
    vocabulary_descriptors: int = 20000
    # k-majority iterations that learn it
    vocabulary_iterations: int = 5
    # keyframes a query returns (their points become the candidates)
    top_keyframes: int = 10


class KeyframeIndex:
    """Keyframes as bags of binary words with an inverted index (ORB-SLAM's keyframe database).

    Keyframes are added by their index in the atlas's keyframe list with their descriptors ``(D, 32)``
    uint8; before the vocabulary exists they wait, and are indexed when it is learned.
    """

    def __init__(self) -> None:
        self.vocabulary: np.ndarray | None = None  # (W, 32) uint8
        self._waiting: list[tuple[int, np.ndarray]] = []
        self._waiting_descriptors = 0
        # per word: the keyframes that have it and its share of their descriptors, in growable arrays
        # whose first ``_doc_freq[word]`` entries are used
        self._postings_keyframe: list[np.ndarray] = []
        self._postings_weight: list[np.ndarray] = []
        self._doc_freq = np.zeros(0, np.int64)
        self._docs = 0

    def add(self, keyframe: int, descriptors: np.ndarray, opts: RetrievalOptions) -> None:
        """Index keyframe ``keyframe`` by its descriptors ``(D, 32)``."""
        if len(descriptors) == 0:
            return
        if self.vocabulary is None:
            self._waiting.append((keyframe, descriptors))
            self._waiting_descriptors += len(descriptors)
            if self._waiting_descriptors >= opts.vocabulary_descriptors:
                self._learn_vocabulary(opts)
            return
        words, shares = self._bag(descriptors)
        for word, share in zip(words.tolist(), shares.tolist(), strict=True):
            used = int(self._doc_freq[word])
            if used == len(self._postings_keyframe[word]):  # full: double
                self._postings_keyframe[word] = np.resize(self._postings_keyframe[word], 2 * used + 8)
                self._postings_weight[word] = np.resize(self._postings_weight[word], 2 * used + 8)
            self._postings_keyframe[word][used] = keyframe
            self._postings_weight[word][used] = share
            self._doc_freq[word] = used + 1
        self._docs += 1

    def query(
        self, descriptors: np.ndarray, eligible: np.ndarray, opts: RetrievalOptions
    ) -> np.ndarray | None:
        """The eligible keyframes most alike the query ``(Q, 32)``, best first; None before a vocabulary.

        Args:
            descriptors: the query frame's descriptors, ``(Q, 32)`` uint8.
            eligible: which keyframes may be returned, ``(K,)`` bool over the atlas's keyframes.
            opts: how many to return.

        Returns:
            Keyframe indices ``(<= top_keyframes,)`` that share at least one word with the query.
        """
        if self.vocabulary is None:
            return None
        if len(descriptors) == 0 or self._docs == 0:
            return np.zeros(0, np.int64)
        words, shares = self._bag(descriptors)
        lengths = self._doc_freq[words]
        used = list(zip(words.tolist(), lengths.tolist(), strict=True))
        keyframes = np.concatenate([self._postings_keyframe[w][:n] for w, n in used])
        weights = np.concatenate([self._postings_weight[w][:n] for w, n in used])
        idf = np.log(self._docs / np.maximum(lengths, 1))
        score = np.repeat(idf, lengths) * np.minimum(np.repeat(shares, lengths), weights)
        scores = np.bincount(keyframes, weights=score, minlength=len(eligible))[: len(eligible)]
        scores[~eligible] = 0.0
        best = np.argsort(-scores, kind="stable")[: opts.top_keyframes]
        return best[scores[best] > 0.0]

    def _bag(self, descriptors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Distinct words ``(B,)`` of descriptors ``(D, 32)`` and each word's share of them ``(B,)``."""
        assert self.vocabulary is not None  # noqa: S101 -- callers check; for the type checker
        labels = _nearest_words(descriptors, self.vocabulary)
        words, counts = np.unique(labels, return_counts=True)
        return words, counts / len(labels)

    def _learn_vocabulary(self, opts: RetrievalOptions) -> None:
        """Learn the words from the waiting keyframes' descriptors, then index those keyframes."""
        data = np.concatenate([d for _, d in self._waiting])
        self.vocabulary = k_majority(data, opts.words, opts.vocabulary_iterations)
        n_words = len(self.vocabulary)
        self._postings_keyframe = [np.zeros(0, np.int32) for _ in range(n_words)]
        self._postings_weight = [np.zeros(0, np.float32) for _ in range(n_words)]
        self._doc_freq = np.zeros(n_words, np.int64)
        waiting, self._waiting = self._waiting, []
        for keyframe, descriptors in waiting:
            self.add(keyframe, descriptors, opts)


def k_majority(descriptors: np.ndarray, words: int, iterations: int) -> np.ndarray:
    """Binary k-means: ``words`` centres ``(W, 32)`` of descriptors ``(N, 32)`` uint8 (W <= N).

    Starts from a farthest-first traversal (each next centre the descriptor farthest from those
    chosen: deterministic, and the centres spread over the data rather than crowd where it is dense);
    each iteration assigns every descriptor
    to its nearest centre (Hamming) and makes each centre the bitwise majority of its descriptors (a
    centre left without any keeps its bits).
    """
    n = len(descriptors)
    chosen = [0]
    dist = _hamming_to(descriptors, descriptors[0])
    for _ in range(min(words, n) - 1):
        chosen.append(int(np.argmax(dist)))
        dist = np.minimum(dist, _hamming_to(descriptors, descriptors[chosen[-1]]))
    centres = descriptors[chosen].copy()
    bits = np.unpackbits(descriptors, axis=1).astype(np.int32)  # (N, 256)
    for _ in range(iterations):
        labels = _nearest_words(descriptors, centres)
        order = np.argsort(labels, kind="stable")
        used, starts = np.unique(labels[order], return_index=True)
        ones = np.add.reduceat(bits[order], starts, axis=0)  # (U, 256) ones per bit
        counts = np.diff(np.r_[starts, n])[:, None]
        centres[used] = np.packbits((2 * ones > counts).astype(np.uint8), axis=1)
    return centres


def _hamming_to(descriptors: np.ndarray, one: np.ndarray) -> np.ndarray:
    """Hamming distances ``(N,)`` of descriptors ``(N, 32)`` to one descriptor ``(32,)``."""
    words = np.ascontiguousarray(descriptors).view(np.uint64)  # (N, 4)
    return np.bitwise_count(words ^ np.ascontiguousarray(one).view(np.uint64)).sum(axis=1, dtype=np.int64)


def _nearest_words(descriptors: np.ndarray, vocabulary: np.ndarray) -> np.ndarray:
    """Index of each descriptor's nearest word (Hamming), ``(D,)``."""
    matches = cv2.BFMatcher(cv2.NORM_HAMMING).match(descriptors, vocabulary)
    labels = np.empty(len(descriptors), np.int64)
    labels[[m.queryIdx for m in matches]] = [m.trainIdx for m in matches]
    return labels
