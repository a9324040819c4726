package images

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"

	"github.com/stokehq/stoke/weightstore/nodecache/ctrdcache/ctrdtest"
)

const testNamespace = "stoke-images-test"

// openClient connects to containerd at socket for the test's duration.
func openClient(t *testing.T, socket string) *containerd.Client {
	t.Helper()
	client, err := containerd.New(socket, containerd.WithTimeout(10*time.Second))
	if err != nil {
		t.Fatalf("connect to containerd: %v", err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

func TestImportUnpacksIntoContainerd(t *testing.T) {
	res := stokeImages(t)
	socket := ctrdtest.Start(t)
	client := openClient(t, socket)
	ctx := namespaces.WithNamespace(context.Background(), testNamespace)

	for _, name := range []string{StokeImage, EngineImage} {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			names, err := Import(context.Background(), socket, testNamespace, res.Archives[name])
			if err != nil {
				t.Fatalf("Import %s: %v", describe(res, name), err)
			}
			t.Logf("imported and unpacked %s in %v", res.Refs[name], time.Since(start))
			if !slices.Equal(names, []string{res.Refs[name]}) {
				t.Fatalf("Import named %q, want [%s]", names, res.Refs[name])
			}
			rec, err := client.ImageService().Get(ctx, res.Refs[name])
			if err != nil {
				t.Fatalf("containerd does not list %s: %v", res.Refs[name], err)
			}
			if got := rec.Target.Digest.String(); got != res.Digests[name] {
				t.Errorf("containerd's %s points at %s, the archive at %s", res.Refs[name], got, res.Digests[name])
			}
			unpacked, err := containerd.NewImage(client, rec).IsUnpacked(ctx, "overlayfs")
			if err != nil || !unpacked {
				t.Errorf("%s unpacked in overlayfs: %v, %v", res.Refs[name], unpacked, err)
			}

			// Importing again changes nothing and fails nothing.
			again, err := Import(context.Background(), socket, testNamespace, res.Archives[name])
			if err != nil || !slices.Equal(again, names) {
				t.Errorf("second Import: %q, %v; want %q", again, err, names)
			}
		})
	}

	list, err := client.ImageService().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, im := range list {
		listed = append(listed, im.Name)
	}
	slices.Sort(listed)
	if want := []string{res.Refs[EngineImage], res.Refs[StokeImage]}; !slices.Equal(listed, want) {
		t.Errorf("namespace %s holds images %q, want %q", testNamespace, listed, want)
	}
}

func TestImportFallsBackToTheNextSnapshotter(t *testing.T) {
	res := buildImages(t, Options{})
	socket := ctrdtest.Start(t)
	got, err := ImportArchive(context.Background(), res.Archives[EngineImage], ImportOptions{
		Socket: socket, Namespace: testNamespace, Snapshotters: []string{"no-such-snapshotter", "native"},
	})
	if err != nil {
		t.Fatalf("ImportArchive: %v", err)
	}
	want := []Imported{{Name: res.Refs[EngineImage], Digest: res.Digests[EngineImage], Snapshotter: "native"}}
	if !slices.Equal(got, want) {
		t.Fatalf("ImportArchive = %+v, want %+v", got, want)
	}
	client := openClient(t, socket)
	ctx := namespaces.WithNamespace(context.Background(), testNamespace)
	img, err := client.GetImage(ctx, res.Refs[EngineImage])
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := img.IsUnpacked(ctx, "native"); err != nil || !ok {
		t.Errorf("unpacked in native: %v, %v", ok, err)
	}

	_, err = ImportArchive(context.Background(), res.Archives[EngineImage], ImportOptions{
		Socket: socket, Namespace: testNamespace, Snapshotters: []string{"no-such-snapshotter"},
	})
	if err == nil || !strings.Contains(err.Error(), "no-such-snapshotter") {
		t.Errorf("ImportArchive with no usable snapshotter: %v, want an error naming it", err)
	}
}

func TestImportRefusesBadInput(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.tar")
	if err := os.WriteFile(garbage, []byte("this is not a tar archive"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name          string
		daemon        bool // whether the case needs a running containerd
		namespace     string
		archive, want string
	}{
		{"no socket", false, testNamespace, garbage, "no containerd socket"},
		{"no namespace", true, "", garbage, "no containerd namespace"},
		{"missing archive", true, testNamespace, filepath.Join(dir, "absent.tar"), "absent.tar"},
		{"not an archive", true, testNamespace, garbage, "import " + garbage},
	}
	socket := ""
	for _, tc := range tests {
		// The cases without a daemon come first and run even where
		// containerd cannot start.
		if tc.daemon && socket == "" {
			socket = ctrdtest.Start(t)
		}
		sock := ""
		if tc.daemon {
			sock = socket
		}
		t.Run(tc.name, func(t *testing.T) {
			names, err := Import(context.Background(), sock, tc.namespace, tc.archive)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Import = %q, %v; want an error containing %q", names, err, tc.want)
			}
		})
	}
}
