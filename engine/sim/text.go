package sim

import "strings"

// Word returns the text the simulated model emits at output position
// position (0-based) of a request seeded with seed: a common English word,
// preceded by a space except at position 0, capitalised at the start of a
// sentence, and followed by a comma, full stop or question mark where a
// phrase ends. Concatenating Word(seed, 0), Word(seed, 1), ... gives
// readable prose ("After the long winter we will travel again. ..."). The
// result depends only on (seed, position), in constant time; different seeds
// give different text. A negative position counts as 0.
//
// Positions are grouped into phrases of phraseLen words; the phrase's
// template (chosen from seed and the phrase's index) gives each slot a word
// class, and the slot's own hash picks the word.
func Word(seed uint64, position int) string {
	position = max(position, 0)
	phrase, slot := position/phraseLen, position%phraseLen
	w := slotWord(seed, phrase, slot)
	if w == "a" && startsWithVowel(slotWord(seed, phrase, slot+1)) {
		w = "an"
	}

	var b strings.Builder
	b.Grow(len(w) + 2)
	if position > 0 {
		b.WriteByte(' ')
	}
	if slot == 0 && (phrase == 0 || endsSentence(phraseEnd(seed, phrase-1))) {
		b.WriteString(strings.ToUpper(w[:1]))
		b.WriteString(w[1:])
	} else {
		b.WriteString(w)
	}
	if slot == phraseLen-1 {
		b.WriteString(phraseEnd(seed, phrase))
	}
	return b.String()
}

// phraseLen is the number of words in every phrase template.
const phraseLen = 8

// wordClass is a slot in a phrase template.
type wordClass uint8

const (
	det wordClass = iota
	adj
	noun
	verb
	modal
	adv
	prep
	pron
	conj
)

// classWords lists the words of each class.
var classWords = [...][]string{
	det: {"the", "a", "this", "that", "every", "some", "their", "our", "its", "each", "his", "her", "one", "another"},
	adj: {
		"good", "new", "first", "last", "long", "great", "little", "old", "big", "high",
		"different", "small", "large", "next", "early", "young", "important", "public", "same", "quiet",
		"bright", "warm", "cold", "simple", "clear", "strong", "whole", "free", "real", "full",
		"special", "easy", "certain", "modern", "green", "gentle", "careful", "sudden", "distant", "ancient",
		"curious", "happy", "patient", "steady", "wide", "open", "late", "narrow", "busy", "calm",
	},
	noun: {
		"time", "year", "way", "day", "man", "woman", "child", "world", "life", "hand",
		"part", "place", "case", "week", "company", "system", "program", "question", "work", "government",
		"number", "night", "point", "home", "room", "mother", "area", "story", "fact", "month",
		"study", "book", "eye", "job", "word", "business", "issue", "side", "kind", "head",
		"house", "service", "friend", "father", "power", "hour", "game", "line", "end", "member",
		"law", "car", "city", "community", "name", "president", "team", "minute", "idea", "body",
		"parent", "face", "level", "office", "door", "person", "war", "history", "party", "result",
		"change", "morning", "reason", "girl", "moment", "teacher", "river", "garden", "window", "road",
		"village", "mountain", "letter", "song", "summer", "winter", "table", "paper", "market", "school",
		"light", "field", "answer", "plan", "journey", "season", "evening", "voice", "street", "forest",
		"island", "bridge", "dinner", "boat", "harbor", "kitchen", "machine", "picture", "problem", "promise",
	},
	verb: {
		"say", "get", "make", "know", "take", "see", "find", "tell", "ask", "feel",
		"try", "leave", "call", "keep", "begin", "help", "turn", "start", "show", "hear",
		"play", "move", "like", "hold", "bring", "write", "provide", "lose", "pay", "meet",
		"include", "continue", "learn", "lead", "understand", "watch", "follow", "stop", "create", "read",
		"spend", "open", "win", "offer", "remember", "love", "consider", "buy", "serve", "build",
		"reach", "suggest", "raise", "pass", "sell", "explain", "develop", "carry", "receive", "support",
		"visit", "answer", "choose", "clean", "paint", "share", "miss", "protect", "describe", "notice",
	},
	modal: {"will", "can", "would", "could", "should", "might", "must", "may"},
	adv: {
		"very", "often", "always", "never", "soon", "still", "already", "together", "almost", "slowly",
		"quickly", "really", "perhaps", "later", "today", "again", "once", "nearly", "quietly", "finally",
	},
	prep: {"of", "in", "on", "with", "from", "at", "by", "into", "over", "after", "before", "near", "under", "across", "behind", "through"},
	pron: {"we", "they", "you", "people", "others", "many"},
	conj: {"and", "but", "so", "while", "because", "when", "if", "although"},
}

// templates are the phrase shapes. A determiner never ends a phrase, so the
// word after it (which decides "a" or "an") is always in the same phrase.
var templates = [...][phraseLen]wordClass{
	{det, adj, noun, modal, verb, det, adj, noun},   // the quiet river will carry a distant letter
	{pron, verb, det, noun, prep, det, adj, noun},   // they find the garden near the old village
	{det, noun, prep, det, noun, modal, adv, verb},  // the teacher from the city can slowly build
	{conj, pron, modal, adv, verb, det, adj, noun},  // but we could never find the simple answer
	{prep, det, adj, noun, pron, modal, verb, adv},  // after the long winter we will travel again
	{det, adj, noun, prep, det, noun, modal, verb},  // the young teacher of the school would listen
	{pron, modal, verb, det, noun, prep, det, noun}, // you can see the light over the river
	{adv, pron, verb, det, adj, noun, prep, noun},   // perhaps they remember a warm evening in summer
}

// slotWord is the bare word at one slot of one phrase.
func slotWord(seed uint64, phrase, slot int) string {
	tmpl := templates[hash3(seed, uint64(phrase), 0x7e3a1)%uint64(len(templates))]
	words := classWords[tmpl[slot]]
	return words[hash3(seed, uint64(phrase), uint64(slot)+1)%uint64(len(words))]
}

// phraseEnd is the punctuation after a phrase's last word: a full stop
// about half the time, sometimes a comma or a question mark, else nothing.
func phraseEnd(seed uint64, phrase int) string {
	switch hash3(seed, uint64(phrase), 0x5eed) % 100 {
	case 0, 1, 2, 3:
		return "?"
	}
	switch r := hash3(seed, uint64(phrase), 0xe4d) % 100; {
	case r < 55:
		return "."
	case r < 85:
		return ","
	}
	return ""
}

func endsSentence(punct string) bool { return punct == "." || punct == "?" }

func startsWithVowel(w string) bool { return w != "" && strings.ContainsRune("aeiou", rune(w[0])) }

// hash3 mixes three values into 64 well-spread bits (SplitMix64 finaliser).
func hash3(a, b, c uint64) uint64 {
	return mix64(mix64(mix64(a)^b) ^ c)
}

func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}
