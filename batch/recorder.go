package batch

import (
	"context"
	"sync"
	"time"

	"github.com/stokehq/stoke/internal/store"
)

// Group commit of line results.
const (
	// recordEvery is the longest a finished line waits for its record.
	recordEvery = 20 * time.Millisecond
	// recordBatch is the most lines recorded in one transaction.
	recordBatch = 512
)

// recorder records a batch's finished lines in group commits: one
// transaction (and fsync) for every line that finished within recordEvery,
// so thousands of lines a second cost tens of commits. A line counts only
// once its commit is done. Results it could not record (the state store
// failed) are dropped: their lines stay pending and run again.
type recorder struct {
	s  *Service
	id string

	mu      sync.Mutex
	buf     []store.LineResult
	kick    chan struct{}
	flushed chan chan struct{}
	done    chan struct{}
	n       int // lines recorded
}

func newRecorder(s *Service, id string) *recorder {
	r := &recorder{s: s, id: id, kick: make(chan struct{}, 1), flushed: make(chan chan struct{}), done: make(chan struct{})}
	go r.run()
	return r
}

// add queues a finished line's result.
func (r *recorder) add(res store.LineResult) {
	r.mu.Lock()
	r.buf = append(r.buf, res)
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// flush returns once every result added before it is recorded (or
// dropped).
func (r *recorder) flush() {
	ack := make(chan struct{})
	select {
	case r.flushed <- ack:
		<-ack
	case <-r.done:
	}
}

// close records what is queued and stops the recorder.
func (r *recorder) close() {
	r.flush()
	close(r.done)
}

// recorded is how many lines the recorder recorded.
func (r *recorder) recorded() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

func (r *recorder) run() {
	for {
		select {
		case <-r.done:
			return
		case ack := <-r.flushed:
			r.commit()
			close(ack)
		case <-r.kick:
			// Let the lines finishing about now join this commit.
			t := time.NewTimer(recordEvery)
			select {
			case <-t.C:
			case ack := <-r.flushed:
				t.Stop()
				r.commit()
				close(ack)
				continue
			}
			r.commit()
		}
	}
}

// commit records what is queued, recordBatch lines per transaction. It
// runs even while serve stops: the answers are in hand.
func (r *recorder) commit() {
	ctx := context.Background()
	for {
		r.mu.Lock()
		n := min(len(r.buf), recordBatch)
		batch := r.buf[:n:n]
		r.buf = r.buf[n:]
		r.mu.Unlock()
		if n == 0 {
			return
		}
		got, err := r.s.o.Store.RecordLines(ctx, r.id, batch)
		if err != nil {
			r.s.log.Error("record batch lines; they will run again", "batch", r.id, "lines", n, "err", err)
			continue
		}
		var failed int
		for _, res := range batch {
			if res.Failed {
				failed++
			}
		}
		// A line recorded before (a run that was cut short) is skipped by
		// the store; the counters count what this commit recorded.
		ok := min(got, n-failed)
		r.s.metrics.lines.WithLabelValues("succeeded").Add(float64(ok))
		r.s.metrics.lines.WithLabelValues("failed").Add(float64(got - ok))
		r.s.metrics.pending.Sub(float64(got))
		r.mu.Lock()
		r.n += got
		r.mu.Unlock()
	}
}
