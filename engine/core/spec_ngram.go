package core

import (
	"slices"

	"github.com/stokehq/stoke/engine/sched"
)

// ngramProposer proposes by prompt lookup (vLLM's "ngram" method): the
// tokens that followed the most recent earlier occurrence of a request's
// last n tokens, for n from max down to min, in its prompt and output.
// It computes nothing, and suits extractive work (summaries, code edits,
// quoting) where the output repeats the prompt.
type ngramProposer struct{ min, max int }

func (p ngramProposer) propose(reqs []*sched.Request, ks []int) {
	for i, r := range reqs {
		r.Drafts = promptLookup(r.Tokens(), p.min, p.max, ks[i])
	}
}

func (ngramProposer) close() error { return nil }

// promptLookup returns up to k tokens that followed the most recent
// earlier occurrence of the last n tokens of tokens, for the largest n in
// [minN, maxN] that occurs earlier; nil when none does. One backward pass
// finds it: at each earlier position holding the last token it measures
// how far the match reaches back (at most maxN), keeping the first, so
// the most recent, of the longest; a match of maxN ends the search. The
// result is a copy.
func promptLookup(tokens []int32, minN, maxN, k int) []int32 {
	L := len(tokens)
	maxN, minN = min(maxN, L-1), max(minN, 1)
	if k < 1 || maxN < minN {
		return nil
	}
	last := tokens[L-1]
	bestLen, bestEnd := 0, -1
	// e is where a candidate occurrence ends; L-2 at most, so that a token
	// follows it.
	for e := L - 2; e >= 0; e-- {
		if tokens[e] != last {
			continue
		}
		n := 1
		for n < maxN && n <= e && tokens[e-n] == tokens[L-1-n] {
			n++
		}
		if n > bestLen {
			bestLen, bestEnd = n, e
			if n == maxN {
				break
			}
		}
	}
	if bestLen < minN {
		return nil
	}
	return slices.Clone(tokens[bestEnd+1 : min(bestEnd+1+k, L)])
}
