//go:build linux

package ctrdcache

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/stokehq/stoke/weightstore/manifest"
	"github.com/stokehq/stoke/weightstore/nodecache/ctrdcache/ctrdtest"
)

// benchSize is the blob size of the benchmarks: one large shard.
const benchSize = 256 << 20

// benchEnv starts containerd for a benchmark and returns a cache on it.
func benchEnv(b *testing.B) *Cache {
	b.Helper()
	e := env{socket: ctrdtest.Start(b), mountDir: b.TempDir()}
	return e.open(b)
}

// BenchmarkIngest measures Create, Write and Commit of a 256 MiB blob:
// the speed at which a load tees a shard into the cache.
func BenchmarkIngest(b *testing.B) {
	c := benchEnv(b)
	data := randomBytes(1, benchSize)
	b.SetBytes(benchSize)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		binary.LittleEndian.PutUint64(data, uint64(i)+1)
		f := fileOf("shard.safetensors", data)
		b.StartTimer()
		ingest(b, c, f, data)
	}
}

// committedShard ingests a 256 MiB blob and commits it as a revision.
func committedShard(b *testing.B, c *Cache) (manifest.File, *manifest.Manifest) {
	b.Helper()
	data := randomBytes(2, benchSize)
	f := fileOf("shard.safetensors", data)
	ingest(b, c, f, data)
	m := manifestOf("bench", f)
	if err := c.CommitRevision(ctxT(b), m); err != nil {
		b.Fatal(err)
	}
	return f, m
}

// BenchmarkRead measures reading a 256 MiB shard out of the cache: from
// the content store (Open, ReadAt in 4 MiB pieces), from a revision view
// (OpenRevision, then read(2) in 4 MiB pieces, as a loader would; and
// OpenRevision with Close alone), and by cat(1) of the view's file to
// /dev/null for comparison. Data is in the
// page cache: these are the cache's overheads, not the disk's speed.
func BenchmarkRead(b *testing.B) {
	c := benchEnv(b)
	f, m := committedShard(b, c)
	buf := make([]byte, 4<<20)

	b.Run("blob", func(b *testing.B) {
		b.SetBytes(benchSize)
		for range b.N {
			blob, err := c.Open(ctxT(b), f)
			if err != nil {
				b.Fatal(err)
			}
			n, err := drain(io.NewSectionReader(blob, 0, blob.Size()), buf)
			if err != nil || n != benchSize {
				b.Fatalf("read %d bytes: %v", n, err)
			}
			blob.Close()
		}
	})
	for _, cold := range []bool{false, true} {
		name := "view"
		if cold {
			name = "view-cold"
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(benchSize)
			for range b.N {
				r, err := c.OpenRevision(ctxT(b), m.Revision)
				if err != nil {
					b.Fatal(err)
				}
				file, err := os.Open(filepath.Join(r.Dir(), f.Name))
				if err != nil {
					b.Fatal(err)
				}
				if cold {
					b.StopTimer()
					evict(b, file)
					b.StartTimer()
				}
				n, err := drain(file, buf)
				file.Close()
				if err != nil || n != benchSize {
					b.Fatalf("read %d bytes: %v", n, err)
				}
				if err := r.Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("open-close", func(b *testing.B) {
		for range b.N {
			r, err := c.OpenRevision(ctxT(b), m.Revision)
			if err != nil {
				b.Fatal(err)
			}
			if err := r.Close(); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, cold := range []bool{false, true} {
		name := "cat"
		if cold {
			name = "cat-cold"
		}
		b.Run(name, func(b *testing.B) {
			r, err := c.OpenRevision(ctxT(b), m.Revision)
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			path := filepath.Join(r.Dir(), f.Name)
			file, err := os.Open(path)
			if err != nil {
				b.Fatal(err)
			}
			defer file.Close()
			b.SetBytes(benchSize)
			b.ResetTimer()
			for range b.N {
				if cold {
					b.StopTimer()
					evict(b, file)
					b.StartTimer()
				}
				cmd := exec.Command("sh", "-c", fmt.Sprintf("cat %q > /dev/null", path))
				if out, err := cmd.CombinedOutput(); err != nil {
					b.Fatalf("cat: %v: %s", err, out)
				}
			}
		})
	}
}

// evict drops file's pages from the page cache (only this file's, unlike
// drop_caches), so that the next read comes from the disk.
func evict(b *testing.B, file *os.File) {
	b.Helper()
	if err := unix.Fadvise(int(file.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		b.Fatalf("fadvise %s: %v", file.Name(), err)
	}
}

// drain reads r to its end in len(buf) pieces. (io.Copy to io.Discard
// would read in 8 KiB pieces instead, whatever the buffer.)
func drain(r io.Reader, buf []byte) (int64, error) {
	var total int64
	for {
		n, err := r.Read(buf)
		total += int64(n)
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// BenchmarkCommitRevision measures building a revision of one 256 MiB
// shard: copying it from the content store into a new snapshot.
func BenchmarkCommitRevision(b *testing.B) {
	c := benchEnv(b)
	data := randomBytes(3, benchSize)
	f := fileOf("shard.safetensors", data)
	ingest(b, c, f, data)
	b.SetBytes(benchSize)
	b.ResetTimer()
	for i := range b.N {
		g := f
		g.Name = fmt.Sprintf("shard-%d.safetensors", i)
		if err := c.CommitRevision(ctxT(b), manifestOf("bench", g)); err != nil {
			b.Fatal(err)
		}
	}
}
