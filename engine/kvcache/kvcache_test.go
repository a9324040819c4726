package kvcache

import "testing"

func TestBlocksForBudget(t *testing.T) {
	shape := Shape{Layers: 2, KVHeads: 2, HeadDim: 4} // 2*2*16*8*4 = 2048 bytes a block
	for _, tc := range []struct {
		name  string
		shape Shape
		bytes int64
		want  int
	}{
		{"exact", shape, 4 * 2048, 4},
		{"rounds down", shape, 4*2048 + 2047, 4},
		{"less than a block", shape, 2047, 0},
		{"zero budget", shape, 0, 0},
		{"negative budget", shape, -2048, 0},
		{"bad shape", Shape{Layers: 2, KVHeads: 0, HeadDim: 4}, 1 << 20, 0},
		{"capped at int32 ids", Shape{Layers: 1, KVHeads: 1, HeadDim: 1}, 1 << 62, 1<<31 - 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := BlocksForBudget(tc.shape, tc.bytes); got != tc.want {
				t.Fatalf("BlocksForBudget(%+v, %d) = %d, want %d", tc.shape, tc.bytes, got, tc.want)
			}
		})
	}
}

func TestNewShape(t *testing.T) {
	shape := Shape{Layers: 3, KVHeads: 2, HeadDim: 4}
	c, err := New(shape, 5)
	if err != nil {
		t.Fatal(err)
	}
	if c.Shape() != shape || c.NumBlocks() != 5 {
		t.Fatalf("cache has shape %+v and %d blocks, want %+v and 5", c.Shape(), c.NumBlocks(), shape)
	}
	if got := len(c.BlockKeys(2, 4)); got != BlockSize*8 {
		t.Fatalf("last block of last layer holds %d keys, want %d", got, BlockSize*8)
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
	for _, tc := range []struct {
		name      string
		shape     Shape
		numBlocks int
	}{
		{"zero kv heads", Shape{Layers: 1, KVHeads: 0, HeadDim: 4}, 1},
		{"zero layers", Shape{Layers: 0, KVHeads: 1, HeadDim: 4}, 1},
		{"zero blocks", Shape{Layers: 1, KVHeads: 1, HeadDim: 4}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.shape, tc.numBlocks); err == nil {
				t.Fatalf("accepted %+v with %d blocks", tc.shape, tc.numBlocks)
			}
		})
	}
}

func TestNewIsZeroedAndFreesOnce(t *testing.T) {
	c, err := New(Shape{Layers: 3, KVHeads: 2, HeadDim: 4}, 5)
	if err != nil {
		t.Fatal(err)
	}
	for l := range 3 {
		for b := range int32(5) {
			for i, v := range append(c.BlockKeys(l, b), c.BlockValues(l, b)...) {
				if v != 0 {
					t.Fatalf("layer %d block %d: value %d of a new pool is %v", l, b, i, v)
				}
			}
		}
	}
	if err := c.Free(); err != nil {
		t.Fatal(err)
	}
	if err := c.Free(); err != nil {
		t.Fatalf("second Free: %v", err)
	}
}
