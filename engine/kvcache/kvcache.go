// Package kvcache holds the keys and values of every attention layer in a
// paged pool of fixed-size blocks, addressed through per-sequence block
// tables, so that sequences can grow without copying and later share
// prefix blocks.
package kvcache

import (
	"errors"
	"fmt"
)

// BlockSize is the number of token positions one block holds.
const BlockSize = 16

// ErrOutOfBlocks is returned when the pool has no free block left.
var ErrOutOfBlocks = errors.New("kv cache: out of blocks")

// Shape describes the per-layer key/value geometry of a model.
type Shape struct {
	Layers  int
	KVHeads int
	HeadDim int
}

// TokenSize is the number of float32 values one token's keys (or values)
// take in one layer.
func (s Shape) TokenSize() int { return s.KVHeads * s.HeadDim }

// BytesPerBlock is the memory one block takes across all layers, keys and
// values together.
func (s Shape) BytesPerBlock() int64 {
	return int64(2*s.Layers*BlockSize*s.TokenSize()) * 4
}

// Cache is a pool of KV blocks with a simple free-list allocator. It is not
// safe for concurrent use; the engine's scheduler owns it.
type Cache struct {
	shape     Shape
	numBlocks int
	keys      [][]float32 // per layer: [block][slot][kvHead][headDim]
	values    [][]float32
	free      []int32
}

// New allocates a pool of numBlocks blocks for a model of the given shape.
func New(shape Shape, numBlocks int) (*Cache, error) {
	if shape.Layers <= 0 || shape.KVHeads <= 0 || shape.HeadDim <= 0 || numBlocks <= 0 {
		return nil, fmt.Errorf("kv cache: invalid shape %+v with %d blocks", shape, numBlocks)
	}
	c := &Cache{shape: shape, numBlocks: numBlocks}
	perLayer := numBlocks * BlockSize * shape.TokenSize()
	c.keys = make([][]float32, shape.Layers)
	c.values = make([][]float32, shape.Layers)
	for l := range c.keys {
		c.keys[l] = make([]float32, perLayer)
		c.values[l] = make([]float32, perLayer)
	}
	c.free = make([]int32, numBlocks)
	for i := range c.free {
		c.free[i] = int32(numBlocks - 1 - i)
	}
	return c, nil
}

// Shape returns the geometry the cache was built for.
func (c *Cache) Shape() Shape { return c.shape }

// NumBlocks is the pool's capacity in blocks.
func (c *Cache) NumBlocks() int { return c.numBlocks }

// NumFree is the number of blocks not held by any sequence.
func (c *Cache) NumFree() int { return len(c.free) }

// Allocate takes one free block.
func (c *Cache) Allocate() (int32, error) {
	if len(c.free) == 0 {
		return 0, ErrOutOfBlocks
	}
	b := c.free[len(c.free)-1]
	c.free = c.free[:len(c.free)-1]
	return b, nil
}

// Free returns blocks to the pool.
func (c *Cache) Free(blocks ...int32) {
	c.free = append(c.free, blocks...)
}

// Grow extends a block table so it covers numTokens positions, allocating
// blocks as needed. On failure the table is returned unchanged and no block
// is leaked.
func (c *Cache) Grow(table []int32, numTokens int) ([]int32, error) {
	need := (numTokens + BlockSize - 1) / BlockSize
	if need <= len(table) {
		return table, nil
	}
	if need-len(table) > len(c.free) {
		return table, fmt.Errorf("grow to %d tokens: %w", numTokens, ErrOutOfBlocks)
	}
	for len(table) < need {
		b, _ := c.Allocate()
		table = append(table, b)
	}
	return table, nil
}

// offset is the index of the first value of (block, slot) within a layer.
func (c *Cache) offset(block int32, slot int) int {
	return (int(block)*BlockSize + slot) * c.shape.TokenSize()
}

// Keys returns the keys of all KV heads for one token position, for reading
// or writing.
func (c *Cache) Keys(layer int, block int32, slot int) []float32 {
	o := c.offset(block, slot)
	return c.keys[layer][o : o+c.shape.TokenSize()]
}

// Values returns the values of all KV heads for one token position.
func (c *Cache) Values(layer int, block int32, slot int) []float32 {
	o := c.offset(block, slot)
	return c.values[layer][o : o+c.shape.TokenSize()]
}

// BlockKeys returns the keys of one block in one layer, laid out
// [slot][kvHead][headDim], so attention can walk a block without bounds
// arithmetic per position.
func (c *Cache) BlockKeys(layer int, block int32) []float32 {
	o := c.offset(block, 0)
	return c.keys[layer][o : o+BlockSize*c.shape.TokenSize()]
}

// BlockValues returns the values of one block in one layer.
func (c *Cache) BlockValues(layer int, block int32) []float32 {
	o := c.offset(block, 0)
	return c.values[layer][o : o+BlockSize*c.shape.TokenSize()]
}
