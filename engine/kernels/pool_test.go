package kernels

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

func TestParallelCoversRangeOnce(t *testing.T) {
	tests := []struct{ count, grain, threads int }{
		{0, 1, 2}, {1, 1, 2}, {5, 1, 2}, {7, 3, 2}, {130, 128, 2}, {1000, 128, 3},
		{10, 0, 4}, {3, 1, 8}, {1024, 4, 1}, {999, 7, 5},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("count=%d/grain=%d/threads=%d", tc.count, tc.grain, tc.threads), func(t *testing.T) {
			p := NewPool(tc.threads)
			defer p.Close()
			hits := make([]int32, tc.count)
			var calls atomic.Int32
			grain := max(tc.grain, 1)
			p.Parallel(tc.count, tc.grain, func(lo, hi int) {
				calls.Add(1)
				if lo%grain != 0 || (hi != tc.count && hi%grain != 0) || lo >= hi {
					t.Errorf("range [%d, %d) is not aligned to grain %d", lo, hi, grain)
				}
				for i := lo; i < hi; i++ {
					atomic.AddInt32(&hits[i], 1)
				}
			})
			for i, h := range hits {
				if h != 1 {
					t.Fatalf("index %d visited %d times", i, h)
				}
			}
			if c := int(calls.Load()); c > tc.threads {
				t.Errorf("%d calls for %d threads", c, tc.threads)
			}
		})
	}
}

func TestNewPoolDefaultThreads(t *testing.T) {
	p := NewPool(0)
	defer p.Close()
	if p.Threads() != runtime.GOMAXPROCS(0) {
		t.Errorf("Threads() = %d, want GOMAXPROCS %d", p.Threads(), runtime.GOMAXPROCS(0))
	}
}

func TestParallelNestedAndConcurrent(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	var total atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Parallel(8, 1, func(lo, hi int) {
				for i := lo; i < hi; i++ {
					p.Parallel(16, 1, func(lo, hi int) { total.Add(int64(hi - lo)) })
				}
			})
		}()
	}
	wg.Wait()
	if got := total.Load(); got != 4*8*16 {
		t.Errorf("nested calls covered %d items, want %d", got, 4*8*16)
	}
}

func TestConcurrentMatMul(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	w := newMatrix(rng, weightKinds[4], 257, 300)
	p := NewPool(2)
	defer p.Close()
	const n = 5
	x := randomVector(rng, n*w.Cols)
	want := make([]float32, n*w.Rows)
	MatMulNaive(want, x, n, w)
	mag := magnitudes(x, n, w)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for g := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, rows := range []int{1, n} { // direct and tiled paths
				got := make([]float32, rows*w.Rows)
				p.MatMul(got, x, rows, w)
				if err := closeTo(got, want[:rows*w.Rows], mag); err != nil {
					errs[g] = err
				}
			}
		}()
	}
	wg.Wait()
	for g, err := range errs {
		if err != nil {
			t.Errorf("goroutine %d: %v", g, err)
		}
	}
}

func TestPoolAfterClose(t *testing.T) {
	p := NewPool(3)
	p.Close()
	p.Close() // idempotent
	var sum atomic.Int64
	p.Parallel(100, 1, func(lo, hi int) { sum.Add(int64(hi - lo)) })
	if sum.Load() != 100 {
		t.Errorf("Parallel after Close covered %d items, want 100", sum.Load())
	}
	var zero Pool
	zero.Parallel(10, 1, func(lo, hi int) { sum.Add(int64(hi - lo)) })
	if sum.Load() != 110 {
		t.Errorf("zero Pool covered %d items, want 10", sum.Load()-100)
	}
}
