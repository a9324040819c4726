// Package kvcache holds the keys and values of every attention layer in a
// paged pool of fixed-size blocks, addressed through per-sequence block
// tables, so that sequences can grow without copying and share prefix
// blocks. Cache is the storage; Manager hands out blocks, counts references
// and keeps finished sequences' full blocks findable by content (prefix
// caching) until their space is needed.
package kvcache

import (
	"fmt"
	"math"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// BlockSize is the number of token positions one block holds.
const BlockSize = 16

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

// BlocksForBudget is how many blocks a memory budget of the given number of
// bytes holds (the --kv-cache-memory flag), or 0 when the budget or shape
// leaves no room for one.
func BlocksForBudget(shape Shape, bytes int64) int {
	per := shape.BytesPerBlock()
	if per <= 0 || bytes <= 0 || shape.Layers <= 0 || shape.KVHeads <= 0 || shape.HeadDim <= 0 {
		return 0
	}
	return int(min(bytes/per, math.MaxInt32))
}

// Cache is the storage of a pool of KV blocks: the keys and values of every
// layer, addressed by block id and slot. Which sequence owns which block is
// the Manager's business. It does no locking; the engine loop owns it.
type Cache struct {
	shape     Shape
	numBlocks int
	keys      [][]float32 // per layer: [block][slot][kvHead][headDim]
	values    [][]float32
	mem       []byte // the mapping keys and values live in
	free      sync.Once
}

// New allocates a pool of numBlocks blocks for a model of the given shape.
// The pool is mapped, not touched: its pages are faulted in as blocks are
// first written, so a new engine (a load, a wake) starts at once, and Free
// hands the memory back to the OS.
func New(shape Shape, numBlocks int) (*Cache, error) {
	if shape.Layers <= 0 || shape.KVHeads <= 0 || shape.HeadDim <= 0 || numBlocks <= 0 || numBlocks > math.MaxInt32 {
		return nil, fmt.Errorf("kv cache: invalid shape %+v with %d blocks", shape, numBlocks)
	}
	perLayer := numBlocks * BlockSize * shape.TokenSize()
	size := 2 * shape.Layers * perLayer * 4
	if size/(2*shape.Layers*4) != perLayer {
		return nil, fmt.Errorf("kv cache: %d blocks of %+v overflow the address space", numBlocks, shape)
	}
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("kv cache: map %d bytes: %w", size, err)
	}
	all := unsafe.Slice((*float32)(unsafe.Pointer(&mem[0])), size/4)
	c := &Cache{shape: shape, numBlocks: numBlocks, mem: mem, keys: make([][]float32, shape.Layers), values: make([][]float32, shape.Layers)}
	for l := range c.keys {
		c.keys[l] = all[2*l*perLayer : (2*l+1)*perLayer : (2*l+1)*perLayer]
		c.values[l] = all[(2*l+1)*perLayer : (2*l+2)*perLayer : (2*l+2)*perLayer]
	}
	return c, nil
}

// Free unmaps the pool. Nothing may read or write it afterwards; calls
// after the first do nothing.
func (c *Cache) Free() error {
	var err error
	c.free.Do(func() {
		c.keys, c.values = nil, nil
		err = unix.Munmap(c.mem)
		c.mem = nil
	})
	return err
}

// Shape returns the geometry the cache was built for.
func (c *Cache) Shape() Shape { return c.shape }

// NumBlocks is the pool's capacity in blocks.
func (c *Cache) NumBlocks() int { return c.numBlocks }

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
