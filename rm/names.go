package rm

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/wire"
)

// Limits on names, chosen so that a key record stays small and printable.
const (
	maxNamespaceLen = 128
	maxKeyLen       = 512
	maxOwnerLen     = 256
	maxRequestIDLen = 128
)

// Namespace normalises a namespace the way lockd clients do (A-Z lower
// case, "default" when empty) and rejects reserved or malformed ones.
func Namespace(ns string) (string, error) {
	if ns == "" {
		return wire.DefaultNamespace, nil
	}
	if strings.HasPrefix(ns, ".") {
		return "", errcode.InvalidNamespace.With("namespaces starting with '.' are reserved")
	}
	if len(ns) > maxNamespaceLen {
		return "", errcode.InvalidNamespace.With("namespace longer than %d bytes", maxNamespaceLen)
	}
	for i := 0; i < len(ns); i++ {
		if c := ns[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return "", errcode.InvalidNamespace.With("namespace may only hold a-z (A-Z is lower-cased), 0-9, '.', '_' and '-'")
		}
	}
	// ASCII only: ToLower changes A-Z and nothing else.
	return strings.ToLower(ns), nil
}

// printable reports whether s is valid UTF-8 without control characters.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// Key validates a key.
func Key(key string) (string, error) {
	switch {
	case key == "":
		return "", errcode.MissingKey.With("key is required")
	case len(key) > maxKeyLen:
		return "", errcode.InvalidKey.With("key longer than %d bytes", maxKeyLen)
	case !printable(key):
		return "", errcode.InvalidKey.With("key must be UTF-8 without control characters")
	}
	return key, nil
}

// Resource validates a (namespace, key) pair.
func Resource(ns, key string) (string, string, error) {
	ns, err := Namespace(ns)
	if err != nil {
		return "", "", err
	}
	key, err = Key(key)
	return ns, key, err
}

// TxnID validates a transaction id: an xid, 20 lowercase base32 characters.
func TxnID(id string) (string, error) {
	if _, err := xid.FromString(id); err != nil {
		return "", errcode.InvalidTxn.With("txn_id %q is not an xid", id)
	}
	return id, nil
}

// LeaseID validates a lease id.
func LeaseID(id string) (string, error) {
	if id == "" {
		return "", errcode.MissingLease.With("lease id is required")
	}
	if _, err := xid.FromString(id); err != nil {
		return "", errcode.InvalidLease.With("lease_id %q is not an xid", id)
	}
	return id, nil
}

func owner(o string) (string, error) {
	switch {
	case o == "":
		return "", errcode.MissingOwner.With("owner is required")
	case len(o) > maxOwnerLen || !printable(o):
		return "", errcode.InvalidBody.With("owner must be printable and at most %d bytes", maxOwnerLen)
	}
	return o, nil
}

func idempotencyKey(id string) error {
	if len(id) > maxRequestIDLen || !printable(id) {
		return errcode.InvalidIdempotency.With("idempotency key must be printable and at most %d bytes", maxRequestIDLen)
	}
	return nil
}
