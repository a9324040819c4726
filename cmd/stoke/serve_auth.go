package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/stokehq/stoke/api"
	"github.com/stokehq/stoke/api/tenancy"
)

// authFlags are serve's authentication flags.
type authFlags struct {
	mode, adminKeyFile string
}

func (f *authFlags) add(fl *pflag.FlagSet) {
	fl.StringVar(&f.mode, "auth", "auto", "who may call the API: keys (a tenant key on /v1, the admin key on /admin), none (anyone), "+
		"or auto (keys once an admin key is set or a tenant key exists; a non-loopback --listen then needs one of them)")
	fl.StringVar(&f.adminKeyFile, "admin-key-file", "", "file whose first line is the admin key of /admin (default: $STOKE_ADMIN_KEY)")
}

// adminKey reads the admin key: --admin-key-file's first line, else
// $STOKE_ADMIN_KEY, else none.
func (f *authFlags) adminKey() (string, error) {
	if f.adminKeyFile == "" {
		return strings.TrimSpace(os.Getenv("STOKE_ADMIN_KEY")), nil
	}
	file, err := os.Open(f.adminKeyFile)
	if err != nil {
		return "", fmt.Errorf("--admin-key-file: %w", err)
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	sc.Scan()
	key := strings.TrimSpace(sc.Text())
	if key == "" {
		return "", fmt.Errorf("--admin-key-file %s: the first line is empty", f.adminKeyFile)
	}
	return key, nil
}

// resolve decides serve's auth mode on listen, and whether /admin is open:
// only on a loopback address with no admin key. A non-loopback address
// with nothing to check keys against is refused unless --auth=none.
func (f *authFlags) resolve(listen string, t *tenancy.Service) (mode api.AuthMode, adminOpen bool, err error) {
	loopback := isLoopback(listen)
	switch f.mode {
	case "none":
		return api.AuthNone, true, nil
	case "keys":
		mode = api.AuthKeys
	case "auto":
		mode = api.AuthAuto
		if !loopback && !t.HasAdminKey() && !t.HasKeys() {
			return 0, false, fmt.Errorf("--listen %s is not a loopback address and there are no API keys: set an admin key "+
				"(--admin-key-file or $STOKE_ADMIN_KEY) and create tenant keys with `stoke admin key create`, or pass --auth=none to serve anyone", listen)
		}
	default:
		return 0, false, fmt.Errorf("--auth: %q is not keys, none or auto", f.mode)
	}
	return mode, loopback && !t.HasAdminKey(), nil
}

// isLoopback reports whether a listen address only takes local
// connections (a unix socket does too).
func isLoopback(listen string) bool {
	if strings.HasPrefix(listen, "unix://") {
		return true
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
