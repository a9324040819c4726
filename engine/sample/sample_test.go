package sample

import "testing"

func TestGreedy(t *testing.T) {
	for _, tc := range []struct {
		logits []float32
		want   int32
	}{
		{[]float32{0, 3, 1}, 1},
		{[]float32{5, 5, 1}, 0},
		{[]float32{-3, -2, -9}, 1},
	} {
		if got := New(Params{TopP: 1}).Sample(tc.logits); got != tc.want {
			t.Errorf("greedy %v = %d, want %d", tc.logits, got, tc.want)
		}
	}
}

func TestSeedReproducible(t *testing.T) {
	logits := make([]float32, 100)
	for i := range logits {
		logits[i] = float32(i%7) * 0.3
	}
	draw := func(seed uint64) []int32 {
		s := New(Params{Temperature: 1, TopP: 1, Seed: seed})
		out := make([]int32, 50)
		for i := range out {
			out[i] = s.Sample(logits)
		}
		return out
	}
	a, b, c := draw(1), draw(1), draw(2)
	same := func(x, y []int32) bool {
		for i := range x {
			if x[i] != y[i] {
				return false
			}
		}
		return true
	}
	if !same(a, b) {
		t.Fatal("same seed gave different draws")
	}
	if same(a, c) {
		t.Fatal("different seeds gave identical draws")
	}
}

func TestTopKAndTopPRestrict(t *testing.T) {
	logits := []float32{10, 9.5, 1, 0, -1}
	for _, tc := range []struct {
		name    string
		p       Params
		allowed map[int32]bool
	}{
		{"top_k=1", Params{Temperature: 1, TopK: 1, TopP: 1}, map[int32]bool{0: true}},
		{"top_k=2", Params{Temperature: 1, TopK: 2, TopP: 1}, map[int32]bool{0: true, 1: true}},
		{"top_p=0.5", Params{Temperature: 1, TopP: 0.5}, map[int32]bool{0: true}},
		{"top_p=0.99", Params{Temperature: 1, TopP: 0.99}, map[int32]bool{0: true, 1: true}},
	} {
		s := New(tc.p)
		for i := 0; i < 500; i++ {
			if got := s.Sample(logits); !tc.allowed[got] {
				t.Fatalf("%s drew %d", tc.name, got)
			}
		}
	}
}

func TestValidate(t *testing.T) {
	for _, p := range []Params{
		{Temperature: -1, TopP: 1},
		{TopK: -1, TopP: 1},
		{TopP: 0},
		{TopP: 1.5},
	} {
		if p.Validate() == nil {
			t.Errorf("%+v accepted", p)
		}
	}
	if err := (Params{Temperature: 0.7, TopK: 40, TopP: 0.9}).Validate(); err != nil {
		t.Error(err)
	}
}
