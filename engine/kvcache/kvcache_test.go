package kvcache

import (
	"errors"
	"testing"
)

func TestGrowAndFree(t *testing.T) {
	c, err := New(Shape{Layers: 2, KVHeads: 2, HeadDim: 4}, 4)
	if err != nil {
		t.Fatal(err)
	}
	var table []int32
	for _, tc := range []struct {
		tokens, blocks, free int
	}{
		{1, 1, 3}, {16, 1, 3}, {17, 2, 2}, {64, 4, 0},
	} {
		table, err = c.Grow(table, tc.tokens)
		if err != nil {
			t.Fatalf("grow to %d: %v", tc.tokens, err)
		}
		if len(table) != tc.blocks || c.NumFree() != tc.free {
			t.Fatalf("grow to %d: %d blocks, %d free; want %d, %d", tc.tokens, len(table), c.NumFree(), tc.blocks, tc.free)
		}
	}
	if _, err := c.Grow(table, 65); !errors.Is(err, ErrOutOfBlocks) {
		t.Fatalf("grow past capacity: %v", err)
	}
	var other []int32
	if other, err = c.Grow(other, 1); !errors.Is(err, ErrOutOfBlocks) || len(other) != 0 {
		t.Fatalf("second sequence got %v, %v", other, err)
	}
	c.Free(table...)
	if c.NumFree() != 4 {
		t.Fatalf("free after release = %d", c.NumFree())
	}
}

func TestSlotsDoNotAlias(t *testing.T) {
	c, err := New(Shape{Layers: 2, KVHeads: 3, HeadDim: 2}, 3)
	if err != nil {
		t.Fatal(err)
	}
	for l := 0; l < 2; l++ {
		for b := int32(0); b < 3; b++ {
			for s := 0; s < BlockSize; s++ {
				k := c.Keys(l, b, s)
				for i := range k {
					k[i] = float32(l*1000 + int(b)*100 + s)
				}
				c.Values(l, b, s)[0] = -k[0]
			}
		}
	}
	for l := 0; l < 2; l++ {
		for b := int32(0); b < 3; b++ {
			bk, bv := c.BlockKeys(l, b), c.BlockValues(l, b)
			for s := 0; s < BlockSize; s++ {
				want := float32(l*1000 + int(b)*100 + s)
				if got := bk[s*6+5]; got != want {
					t.Fatalf("layer %d block %d slot %d key = %v, want %v", l, b, s, got, want)
				}
				if got := bv[s*6]; got != -want {
					t.Fatalf("layer %d block %d slot %d value = %v, want %v", l, b, s, got, -want)
				}
			}
		}
	}
}

func TestNewRejectsBadShape(t *testing.T) {
	if _, err := New(Shape{Layers: 1, KVHeads: 0, HeadDim: 4}, 1); err == nil {
		t.Fatal("accepted zero kv heads")
	}
	if _, err := New(Shape{Layers: 1, KVHeads: 1, HeadDim: 4}, 0); err == nil {
		t.Fatal("accepted zero blocks")
	}
}
