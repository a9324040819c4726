package images

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/distribution/reference"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Names of the two images, the keys of a Result's maps.
const (
	// StokeImage runs `stoke serve`.
	StokeImage = "stoke"
	// EngineImage runs a blank engine listening on EngineSocket.
	EngineImage = "engine"
)

// EngineSocket is the unix socket the engine image's command listens on.
const EngineSocket = SocketDir + "/engine.sock"

// Defaults of Options.
const (
	DefaultRepository = "stoke.local"
	DefaultTag        = "dev"
	DefaultArch       = "amd64"
	DefaultPackage    = "./cmd/stoke"
)

// sourceURL is the project's home, recorded in the images' labels.
const sourceURL = "https://github.com/stokehq/stoke"

// imageSpec is what differs between the two images.
type imageSpec struct {
	name, title, description string
	cmd                      []string
}

var imageSpecs = []imageSpec{
	{
		name:        StokeImage,
		title:       "stoke",
		description: "stoke, a serverless LLM inference platform: push weights, get an OpenAI-compatible endpoint",
		cmd:         []string{"serve"},
	},
	{
		name:        EngineImage,
		title:       "stoke engine",
		description: "A blank stoke inference engine runtime; load a model with POST /admin/load on " + EngineSocket,
		cmd:         []string{"engine", "--blank", "--listen", "unix://" + EngineSocket},
	},
}

// Options says what Build builds and where it writes it.
type Options struct {
	// Binary is the static linux stoke binary the images hold. When empty,
	// Build compiles Package in Source with CGO_ENABLED=0 into a temporary
	// directory, which needs the go command and the source tree.
	Binary string
	// Source is the module directory go build runs in; default ".".
	Source string
	// Package is the command go build compiles; default DefaultPackage.
	Package string
	// Arch is the GOARCH go build compiles for; default DefaultArch. A
	// given Binary brings its own.
	Arch string
	// Out is the directory the archives are written to; it is created if
	// missing. Required.
	Out string
	// Repository prefixes the images' names: Repository/stoke:Tag and
	// Repository/engine:Tag; default DefaultRepository.
	Repository string
	// Tag is the images' tag and their version label; default DefaultTag.
	Tag string
	// Created is the images' creation time; default the Unix epoch, which
	// keeps the digests a function of the binary alone.
	Created time.Time
}

// Result says what Build wrote. Its maps are keyed by image name
// (StokeImage, EngineImage).
type Result struct {
	// Refs are the images' references, such as stoke.local/engine:dev.
	Refs map[string]string
	// Archives are the paths of the OCI image-layout tar archives.
	Archives map[string]string
	// Digests are the digests of the images' manifests.
	Digests map[string]string
	// Layer is the digest of the single layer both images share.
	Layer string
}

// ArchiveName is the file name Build gives the archive of image name.
func ArchiveName(name string) string { return name + ".oci.tar" }

// Build writes the stoke and engine images as OCI image-layout archives in
// opts.Out. The same binary and options give the same digests.
func Build(ctx context.Context, opts Options) (Result, error) {
	if opts.Out == "" {
		return Result{}, errors.New("build images: no output directory")
	}
	repo, tag := opts.Repository, opts.Tag
	if repo == "" {
		repo = DefaultRepository
	}
	if tag == "" {
		tag = DefaultTag
	}
	refs := make(map[string]string, len(imageSpecs))
	for _, s := range imageSpecs {
		ref, err := imageRef(repo, s.name, tag)
		if err != nil {
			return Result{}, err
		}
		refs[s.name] = ref
	}
	created := opts.Created
	if created.IsZero() {
		created = time.Unix(0, 0)
	}
	created = created.UTC().Truncate(time.Second)

	binary := opts.Binary
	if binary == "" {
		tmp, err := os.MkdirTemp("", "stoke-images-")
		if err != nil {
			return Result{}, fmt.Errorf("directory to build stoke in: %w", err)
		}
		defer os.RemoveAll(tmp)
		src, pkg, arch := opts.Source, opts.Package, opts.Arch
		if src == "" {
			src = "."
		}
		if pkg == "" {
			pkg = DefaultPackage
		}
		if arch == "" {
			arch = DefaultArch
		}
		binary = filepath.Join(tmp, "stoke")
		if err := goBuild(ctx, src, pkg, arch, binary); err != nil {
			return Result{}, err
		}
	}
	info, err := inspectBinary(binary)
	if err != nil {
		return Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	layer, err := newBinaryLayer(binary, created)
	if err != nil {
		return Result{}, err
	}
	if err := os.MkdirAll(opts.Out, 0o755); err != nil {
		return Result{}, fmt.Errorf("create output directory: %w", err)
	}

	res := Result{Refs: refs, Archives: map[string]string{}, Digests: map[string]string{}, Layer: layer.digest.String()}
	for _, s := range imageSpecs {
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		img, err := newImage(layer, s, info, tag, created)
		if err != nil {
			return Result{}, fmt.Errorf("assemble image %s: %w", refs[s.name], err)
		}
		path := filepath.Join(opts.Out, ArchiveName(s.name))
		digest, err := writeArchive(path, img, refs[s.name], tag, platformOf(info))
		if err != nil {
			return Result{}, err
		}
		res.Archives[s.name], res.Digests[s.name] = path, digest.String()
	}
	return res, nil
}

// imageRef joins and checks an image reference.
func imageRef(repo, name, tag string) (string, error) {
	s := strings.TrimSuffix(repo, "/") + "/" + name + ":" + tag
	named, err := reference.ParseNormalizedNamed(s)
	if err != nil {
		return "", fmt.Errorf("image reference %q (repository %q, tag %q): %w", s, repo, tag, err)
	}
	if _, ok := named.(reference.Tagged); !ok {
		return "", fmt.Errorf("image reference %q has no tag", s)
	}
	return named.String(), nil
}

func platformOf(info binaryInfo) v1.Platform {
	return v1.Platform{OS: info.os, Architecture: info.arch, Variant: info.variant}
}

// newImage assembles one image around the shared layer.
func newImage(layer v1.Layer, s imageSpec, info binaryInfo, tag string, created time.Time) (v1.Image, error) {
	at := v1.Time{Time: created}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History: v1.History{
			Created:   at,
			CreatedBy: "stoke images build: COPY stoke " + BinaryPath,
			Comment:   "the static stoke binary and an empty root filesystem layout",
		},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Created = at
	cf.OS, cf.Architecture, cf.Variant = info.os, info.arch, info.variant
	cf.Config = imageConfig(s, tag, created, info.revision)
	return mutate.ConfigFile(img, cf)
}

// imageConfig is the runtime configuration of image s: what to run, as
// whom, where, and its labels. revision is the source revision, "" if
// unknown.
func imageConfig(s imageSpec, tag string, created time.Time, revision string) v1.Config {
	labels := map[string]string{
		"org.opencontainers.image.title":       s.title,
		"org.opencontainers.image.description": s.description,
		"org.opencontainers.image.source":      sourceURL,
		"org.opencontainers.image.url":         sourceURL,
		"org.opencontainers.image.version":     tag,
		"org.opencontainers.image.created":     created.Format(time.RFC3339),
	}
	if revision != "" {
		labels["org.opencontainers.image.revision"] = revision
	}
	return v1.Config{
		Entrypoint: []string{BinaryPath},
		Cmd:        s.cmd,
		Env: []string{
			"PATH=/usr/local/bin:/usr/bin:/bin",
			"HOME=" + WorkingDir,
		},
		WorkingDir: WorkingDir,
		User:       "0:0",
		Labels:     labels,
		StopSignal: "SIGTERM",
	}
}
