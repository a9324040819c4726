package bucket

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3Options says how to reach an S3-compatible server.
type S3Options struct {
	// Endpoint is the server: "http://host:port", "https://host" or a bare
	// "host[:port]" (HTTPS). Empty means AWS S3 (s3.amazonaws.com).
	Endpoint string
	// Region is the bucket's region; empty lets the client look it up.
	Region string
	// AccessKey and SecretKey are static credentials; both empty means
	// anonymous requests.
	AccessKey, SecretKey string
	// SessionToken goes with temporary credentials; usually empty.
	SessionToken string
	// PathStyle forces http://host/bucket/key addressing instead of
	// virtual-hosted http://bucket.host/key (MinIO and most non-AWS servers
	// need it; it is picked automatically for them when false).
	PathStyle bool
	// Insecure skips TLS certificate verification (self-signed servers).
	Insecure bool
	// MaxRetries bounds the attempts of one request inside the client
	// (0: minio-go's default of 10). Callers that retry ranges themselves,
	// like the streaming loader, keep it low.
	MaxRetries int
}

// S3OptionsFromEnv reads the usual AWS environment variables:
// AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
// AWS_SESSION_TOKEN and AWS_REGION (or AWS_DEFAULT_REGION).
func S3OptionsFromEnv() S3Options {
	region := os.Getenv("AWS_REGION")
	if region == "" {
		region = os.Getenv("AWS_DEFAULT_REGION")
	}
	return S3Options{
		Endpoint:     os.Getenv("AWS_ENDPOINT_URL"),
		Region:       region,
		AccessKey:    os.Getenv("AWS_ACCESS_KEY_ID"),
		SecretKey:    os.Getenv("AWS_SECRET_ACCESS_KEY"),
		SessionToken: os.Getenv("AWS_SESSION_TOKEN"),
	}
}

// s3Bucket stores objects under prefix in one S3 bucket.
type s3Bucket struct {
	client *minio.Client
	core   *minio.Core // the same client; its GetObject returns the raw body
	bucket string
	prefix string // "" or ending in "/"
}

// s3Endpoint turns S3Options.Endpoint into minio-go's host and TLS flag.
func s3Endpoint(endpoint string) (host string, secure bool, err error) {
	if endpoint == "" {
		return "s3.amazonaws.com", true, nil
	}
	if !strings.Contains(endpoint, "://") {
		return endpoint, true, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", false, fmt.Errorf("parse S3 endpoint %q: %w", endpoint, err)
	}
	if u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return "", false, fmt.Errorf("parse S3 endpoint %q: want scheme://host[:port] with no path", endpoint)
	}
	switch u.Scheme {
	case "http":
		return u.Host, false, nil
	case "https":
		return u.Host, true, nil
	}
	return "", false, fmt.Errorf("parse S3 endpoint %q: scheme %q is not http or https", endpoint, u.Scheme)
}

// openS3 connects to the server and checks, with one HEAD request on the
// bucket, that it exists and the credentials are accepted.
func openS3(ctx context.Context, bkt, prefix string, o S3Options) (*s3Bucket, error) {
	b := &s3Bucket{bucket: bkt}
	if prefix != "" {
		b.prefix = prefix + "/"
	}
	host, secure, err := s3Endpoint(o.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", b.URL(), err)
	}
	opts := &minio.Options{
		Creds:  credentials.NewStaticV4(o.AccessKey, o.SecretKey, o.SessionToken),
		Secure: secure,
		Region: o.Region,
		// MaxRetries 0 keeps minio-go's default.
		MaxRetries: o.MaxRetries,
	}
	if o.PathStyle {
		opts.BucketLookup = minio.BucketLookupPath
	}
	if secure && o.Insecure {
		tr, err := minio.DefaultTransport(true)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", b.URL(), err)
		}
		tr.TLSClientConfig.InsecureSkipVerify = true
		opts.Transport = tr
	}
	core, err := minio.NewCore(host, opts)
	if err != nil {
		return nil, fmt.Errorf("open %s at %s: %w", b.URL(), host, err)
	}
	b.core, b.client = core, core.Client
	ok, err := b.client.BucketExists(ctx, bkt)
	if err != nil {
		return nil, s3Err("open", b.URL()+" at "+host, err)
	}
	if !ok {
		return nil, fmt.Errorf("open %s at %s: %w", b.URL(), host, ErrBucketNotExist)
	}
	return b, nil
}

// s3Err wraps a minio-go error with what was being done and, for the codes
// callers act on, the matching sentinel.
func s3Err(op, what string, err error) error {
	var sentinel error
	switch minio.ToErrorResponse(err).Code {
	case minio.NoSuchKey:
		sentinel = ErrNotExist
	case minio.NoSuchBucket:
		sentinel = ErrBucketNotExist
	case minio.AccessDenied, "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "AllAccessDisabled":
		sentinel = ErrAccessDenied
	case minio.InvalidRange:
		sentinel = ErrInvalidRange
	}
	if sentinel != nil {
		return fmt.Errorf("%s %s: %w: %w", op, what, sentinel, err)
	}
	return fmt.Errorf("%s %s: %w", op, what, err)
}

// URL returns s3://bucket or s3://bucket/prefix.
func (b *s3Bucket) URL() string {
	return "s3://" + strings.TrimSuffix(b.bucket+"/"+b.prefix, "/")
}

func (b *s3Bucket) name(key string) string { return b.URL() + "/" + key }

// List lists recursively with ListObjects; directory markers ("dir/") are
// not objects and are left out.
func (b *s3Bucket) List(ctx context.Context, prefix string) ([]Object, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, fmt.Errorf("list %s: %w", b.URL(), err)
	}
	// Cancelling stops minio-go's listing goroutine if we return early.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var objs []Object
	for info := range b.client.ListObjects(ctx, b.bucket, minio.ListObjectsOptions{Prefix: b.prefix + prefix, Recursive: true}) {
		if info.Err != nil {
			return nil, s3Err("list", fmt.Sprintf("%s prefix %q", b.URL(), prefix), info.Err)
		}
		key := strings.TrimPrefix(info.Key, b.prefix)
		if key == "" || strings.HasSuffix(key, "/") {
			continue
		}
		objs = append(objs, Object{Key: key, Size: info.Size, ETag: info.ETag, LastModified: info.LastModified})
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list %s prefix %q: %w", b.URL(), prefix, err)
	}
	slices.SortFunc(objs, func(x, y Object) int { return strings.Compare(x.Key, y.Key) })
	return objs, nil
}

// Stat describes key with a HEAD request.
func (b *s3Bucket) Stat(ctx context.Context, key string) (Object, error) {
	if err := checkKey(key); err != nil {
		return Object{}, fmt.Errorf("stat %s: %w", b.name(key), err)
	}
	info, err := b.client.StatObject(ctx, b.bucket, b.prefix+key, minio.StatObjectOptions{})
	if err != nil {
		return Object{}, s3Err("stat", b.name(key), err)
	}
	return Object{Key: key, Size: info.Size, ETag: info.ETag, LastModified: info.LastModified}, nil
}

// ReadRange sends one ranged GET and returns its body.
func (b *s3Bucket) ReadRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	what := fmt.Sprintf("%s [%d, +%d)", b.name(key), off, n)
	if err := checkKey(key); err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	if off < 0 {
		return nil, fmt.Errorf("read %s: %w: negative offset", what, ErrInvalidRange)
	}
	if n == 0 {
		return b.emptyRange(ctx, key, off, what)
	}
	var opts minio.GetObjectOptions
	var err error
	switch {
	case n > 0:
		err = opts.SetRange(off, off+n-1)
	case off > 0:
		err = opts.SetRange(off, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	body, _, _, err := b.core.GetObject(ctx, b.bucket, b.prefix+key, opts)
	if err != nil {
		if minio.ToErrorResponse(err).Code == minio.InvalidRange {
			// S3 refuses a range starting at the end; that one is empty.
			return b.emptyRange(ctx, key, off, what)
		}
		return nil, s3Err("read", what, err)
	}
	return body, nil
}

// emptyRange checks that off is within key (at most its size) and returns an
// empty reader.
func (b *s3Bucket) emptyRange(ctx context.Context, key string, off int64, what string) (io.ReadCloser, error) {
	obj, err := b.Stat(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	if off > obj.Size {
		return nil, fmt.Errorf("read %s: %w: offset past the end of a %d-byte object", what, ErrInvalidRange, obj.Size)
	}
	return io.NopCloser(strings.NewReader("")), nil
}

// Put uploads with PutObject, which sends objects above minio-go's part
// size (16 MiB) as a multipart upload; S3 makes either kind visible only
// once complete.
func (b *s3Bucket) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("put %s: %w", b.name(key), err)
	}
	if size < 0 {
		size = -1
	}
	if err := checkSeekableSize(r, size); err != nil {
		return fmt.Errorf("put %s: %w", b.name(key), err)
	}
	_, err := b.client.PutObject(ctx, b.bucket, b.prefix+key, r, size, minio.PutObjectOptions{
		ContentType: "application/octet-stream",
	})
	if err != nil {
		return s3Err("put", b.name(key), err)
	}
	return nil
}

// checkSeekableSize fails a seekable reader holding fewer than size bytes
// before anything is sent: minio-go would otherwise retry the doomed request
// with backoff for seconds.
func checkSeekableSize(r io.Reader, size int64) error {
	s, ok := r.(io.Seeker)
	if !ok || size < 0 {
		return nil
	}
	cur, err := s.Seek(0, io.SeekCurrent)
	if err != nil {
		return nil // not really seekable; the upload finds out
	}
	end, err := s.Seek(0, io.SeekEnd)
	if err != nil {
		return nil
	}
	if _, err := s.Seek(cur, io.SeekStart); err != nil {
		return fmt.Errorf("rewind input: %w", err)
	}
	if end-cur < size {
		return fmt.Errorf("short input: %d of %d bytes", end-cur, size)
	}
	return nil
}

// Delete removes key; S3 treats a missing key as already deleted.
func (b *s3Bucket) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("delete %s: %w", b.name(key), err)
	}
	err := b.client.RemoveObject(ctx, b.bucket, b.prefix+key, minio.RemoveObjectOptions{})
	if err != nil && minio.ToErrorResponse(err).Code != minio.NoSuchKey {
		return s3Err("delete", b.name(key), err)
	}
	return nil
}
