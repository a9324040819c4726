package scaler

import (
	"testing"
	"time"
)

// BenchmarkRecordDecide is one activator tick: a concurrency sample, an
// arrival and a decision, 100 ms apart.
func BenchmarkRecordDecide(b *testing.B) {
	a, err := NewAutoscaler(Config{AvgLatency: time.Second, ColdStart: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	now := epoch
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		now = now.Add(100 * time.Millisecond)
		a.Record(now, float64(i%64))
		a.RecordArrival(now)
		a.Decide(now, Signals{Ready: 4, Waiting: i % 3, KVUsage: 0.5})
	}
}

// BenchmarkRecord is the activator's hot path alone.
func BenchmarkRecord(b *testing.B) {
	a, err := NewAutoscaler(Config{})
	if err != nil {
		b.Fatal(err)
	}
	now := epoch
	for i := 0; b.Loop(); i++ {
		now = now.Add(10 * time.Millisecond)
		a.Record(now, float64(i%64))
		a.RecordArrival(now)
	}
}
