package bucketest

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/minio/minio-go/v7"
)

func TestStartMinIO(t *testing.T) {
	endpoint, ak, sk := StartMinIO(t)
	MakeBucket(t, endpoint, ak, sk, "harness")
	c := Client(t, endpoint, ak, sk)
	ctx := context.Background()

	tests := []struct {
		key  string
		data []byte
	}{
		{"empty", nil},
		{"a/b/c.bin", []byte("hello MinIO")},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			if _, err := c.PutObject(ctx, "harness", tt.key, bytes.NewReader(tt.data), int64(len(tt.data)), minio.PutObjectOptions{}); err != nil {
				t.Fatalf("put: %v", err)
			}
			obj, err := c.GetObject(ctx, "harness", tt.key, minio.GetObjectOptions{})
			if err != nil {
				t.Fatalf("get: %v", err)
			}
			defer obj.Close()
			got, err := io.ReadAll(obj)
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if !bytes.Equal(got, tt.data) {
				t.Errorf("got %q, want %q", got, tt.data)
			}
		})
	}
	if ok, err := c.BucketExists(ctx, "missing"); err != nil || ok {
		t.Errorf("BucketExists(missing) = %v, %v; want false, nil", ok, err)
	}
}
