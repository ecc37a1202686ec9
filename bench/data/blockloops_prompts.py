"""Prompts and sampling of the block-loop set's penalty rounds (see ``BLOCKLOOPS.md``).

Loops that change their words are what a looping model writes when the engine penalises
repetition: a repetition, frequency or presence penalty (or DRY) lowers the odds of the exact
tokens it just wrote, so the loop comes back paraphrased — the same doubt restated, the same
steps redone with other words, the same block with a new name. These rounds ask
competitive-programming, step-by-step math and medical questions (the kinds of answer the
degenerations to catch come from) with such penalties, ``ignore_eos`` on (a runaway to the
token limit) and off (answers that end by themselves: healthy text written under penalties).
"""

from __future__ import annotations

from typing import Any

#: Competitive programming, "think step by step" math and medical explanations.
PENALTY_PROMPTS: dict[str, str] = {
    "cp-pairs": "Competitive programming: given an array of N integers (N up to 200000) and a "
    "value X, count pairs i < j with A[i] + A[j] = X. Write an efficient C++ solution, explain "
    "the approach and its complexity, and consider every edge case.",
    "cp-powsum": "Competitive programming: for Q queries (L, R, k) with k from 2 to 32, output "
    "the sum of A[i]^k for i in [L, R] modulo 1e9+7. Write Python with prefix sums for every "
    "power and explain the precomputation.",
    "cp-grid": "Competitive programming: count the paths from the top-left to the bottom-right "
    "of an N x M grid with obstacles, moving right or down, modulo 998244353. Write C++ and "
    "justify every step of the dynamic programming.",
    "cp-string": "Competitive programming: find the length of the longest substring that "
    "appears at least twice in a string of length up to 100000. Discuss suffix arrays, "
    "hashing and binary search, choose one, and write the code.",
    "cp-graph": "Competitive programming: given a weighted directed graph with N nodes and M "
    "edges, find the shortest path from node 1 to every node, where some weights may be "
    "negative. Explain which algorithm to use and why, then write it in C++.",
    "cp-intervals": "Competitive programming: given N intervals, find the minimum number of "
    "points such that every interval contains at least one point. Prove the greedy choice is "
    "correct and write Java code.",
    "cp-bits": "Competitive programming: for every mask of N bits (N up to 20) compute the sum "
    "of A over all its submasks. Explain sum over subsets dynamic programming, with code.",
    "cp-game": "Competitive programming: two players take 1, 3 or 4 stones from a pile of N "
    "stones, the player who cannot move loses. For which N does the first player win? Think "
    "carefully and verify with a table, then write code.",
    "math-mod": "Think step by step: what is the remainder when 7^2024 is divided by 13? Check "
    "your reasoning and verify the answer a second way.",
    "math-count": "Think step by step: how many positive integers below 1000 are divisible by "
    "3 or 5 but not by 7? Re-check each count before giving the final answer.",
    "math-geo": "Think step by step: a circle is inscribed in a right triangle with legs 9 and "
    "40. Find the radius, then double-check it with a different method.",
    "math-prob": "Think step by step: three cards are drawn from a standard deck without "
    "replacement. What is the probability that all three are hearts? Reconsider whether your "
    "counting is right before answering.",
    "med-dka": "Explain the pathophysiology, diagnosis and management of diabetic "
    "ketoacidosis, step by step, including fluid and insulin therapy and potassium "
    "monitoring.",
    "med-chestpain": "A 58-year-old man has chest pain for two hours. Walk through the "
    "differential diagnosis, the tests you would order in which order, and how each result "
    "changes the management. Be careful and thorough.",
    "med-drugs": "Explain how warfarin interacts with other drugs and foods, why the INR is "
    "monitored, and what to do when the INR is too high, step by step.",
    "reason-logic": "Three boxes are labelled apples, oranges and mixed, and every label is "
    "wrong. You may take one fruit from one box. How do you relabel them? Think it through, "
    "doubt each step, and think again if something seems off.",
}

#: Runaway answers under penalties (``ignore_eos``): llama.cpp's ``repeat_penalty`` over the
#: last ``repeat_last_n`` tokens, OpenAI's frequency and presence penalties, and DRY (which
#: penalises extending a sequence already seen), at temperatures 0.6 to 0.9; and, to compare,
#: one setting with no penalty (``n09``).
PENALTY_SETTINGS: dict[str, dict[str, Any]] = {
    "r07": {"temperature": 0.7, "top_k": 40, "top_p": 0.95, "seed": 53, "ignore_eos": True,
            "repeat_penalty": 1.15, "repeat_last_n": 256},
    "f08": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": 59, "ignore_eos": True,
            "frequency_penalty": 0.4, "presence_penalty": 0.4},
    "d06": {"temperature": 0.6, "top_k": 40, "top_p": 0.95, "seed": 61, "ignore_eos": True,
            "dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2},
    "n09": {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "seed": 79, "ignore_eos": True},
}  # fmt: skip

#: The same prompts and penalties without ``ignore_eos``: answers that end by themselves.
PENALTY_STOP_SETTINGS: dict[str, dict[str, Any]] = {
    "s07": {"temperature": 0.7, "top_k": 40, "top_p": 0.95, "seed": 67,
            "repeat_penalty": 1.15, "repeat_last_n": 256},
    "s08": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": 71,
            "frequency_penalty": 0.4, "presence_penalty": 0.4},
    "s06": {"temperature": 0.6, "top_k": 40, "top_p": 0.95, "seed": 73,
            "dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2},
}  # fmt: skip
