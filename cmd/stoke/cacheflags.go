package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/stokehq/stoke/weightstore/nodecache"
	"github.com/stokehq/stoke/weightstore/nodecache/ctrdcache"
)

// cacheFlags choose the node cache that bucket loads go through.
type cacheFlags struct {
	dir, maxSize, containerdSocket string
	none                           bool
}

func (c *cacheFlags) add(fs *pflag.FlagSet) {
	def := ""
	if d, err := os.UserCacheDir(); err == nil {
		def = filepath.Join(d, "stoke", "weights")
	}
	fs.StringVar(&c.dir, "cache-dir", def, "directory of the node weight cache")
	fs.StringVar(&c.maxSize, "cache-max-size", "0", "size budget of the node cache, least recently used revisions evicted past it (0 = unlimited)")
	fs.StringVar(&c.containerdSocket, "containerd-socket", "", "keep the node cache in containerd (content store + snapshots) at this socket instead of a directory")
	fs.BoolVar(&c.none, "no-cache", false, "load every revision from its bucket, caching nothing on this node")
}

// open returns the configured cache (nil with --no-cache) and its closer.
func (c *cacheFlags) open(ctx context.Context) (nodecache.Cache, func(), error) {
	if c.none {
		return nil, func() {}, nil
	}
	max, err := sizeFlag("cache-max-size", c.maxSize, 0, maxSize)
	if err != nil {
		return nil, nil, err
	}
	switch {
	case c.containerdSocket != "":
		cc, err := ctrdcache.New(ctx, ctrdcache.Options{Socket: c.containerdSocket, MaxBytes: max})
		if err != nil {
			return nil, nil, fmt.Errorf("--containerd-socket: %w", err)
		}
		return cc, func() { cc.Close() }, nil
	case c.dir == "":
		return nil, nil, fmt.Errorf("--cache-dir: no user cache directory here; give one or --no-cache")
	}
	d, err := nodecache.NewDir(c.dir, nodecache.DirOptions{MaxBytes: max})
	if err != nil {
		return nil, nil, fmt.Errorf("--cache-dir: %w", err)
	}
	return d, func() {}, nil
}
