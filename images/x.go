package images
import _ "github.com/google/go-containerregistry/pkg/v1/layout"
import _ "github.com/google/go-containerregistry/pkg/v1/mutate"
import _ "github.com/google/go-containerregistry/pkg/v1/tarball"
