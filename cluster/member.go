package cluster

import (
	"net"
	"strconv"
	"strings"

	"github.com/cockroachdb/errors"
)

// Errors a caller branches on (errors.Is). Every error this package returns
// for these classes carries the mark together with the values involved.
var (
	// ErrInvalid marks bad input: an empty or malformed id, an unknown
	// role, an address that does not parse, an inconsistent CP rank.
	ErrInvalid = errors.New("invalid member")
	// ErrNotFound marks a lookup of a member that is not registered.
	ErrNotFound = errors.New("member not registered")
	// ErrConflict marks a registration whose identity another live member
	// already holds.
	ErrConflict = errors.New("member identity already registered")
	// ErrUnavailable marks a call that could not reach etcd within its
	// bound (the caller's deadline or Config.OpTimeout, the shorter). The
	// call may succeed later: etcd may be restarting.
	ErrUnavailable = errors.New("etcd unreachable")
	// ErrClosed marks a call on a closed provider or registration.
	ErrClosed = errors.New("discovery closed")
)

// Role is what a member does in the cluster.
type Role string

const (
	// RoleDecode is a decode instance: it owns a KV pool that prefill ranks
	// write into.
	RoleDecode Role = "decode"
	// RolePrefill is one prefill rank of a CP group.
	RolePrefill Role = "prefill"
)

// Roles lists every known role.
var Roles = []Role{RoleDecode, RolePrefill}

// Validate reports whether r is a known role.
func (r Role) Validate() error {
	switch r {
	case RoleDecode, RolePrefill:
		return nil
	}
	return errors.Mark(errors.Newf("unknown role %q (want %q or %q)", string(r), RoleDecode, RolePrefill), ErrInvalid)
}

// MaxIDLen bounds a member id; ids are key path segments.
const MaxIDLen = 128

// MaxCPSize bounds a CP group's size: far above any real group, low enough
// that a corrupt record cannot make Group allocate without bound.
const MaxCPSize = 1024

// Member is one process's identity and where its control plane listens.
type Member struct {
	// ID is unique within its role: "decode-1", "prefill-g0-r3". Letters,
	// digits, '.', '_' and '-' only: it is a segment of the etcd key.
	ID   string `json:"id"`
	Role Role   `json:"role"`
	// Addr is the control-plane address (host:port) peers dial: routable
	// from the other members, never a wildcard or port 0.
	Addr string `json:"addr"`
	// Group, Rank and Size place a prefill rank in its CP group (Rank in
	// [0, Size)); all three are zero for a decode instance.
	Group string `json:"group,omitempty"`
	Rank  int    `json:"rank,omitempty"`
	Size  int    `json:"size,omitempty"`
}

// Validate checks m and returns an error marked ErrInvalid naming the
// offending value.
func (m Member) Validate() error {
	if err := ValidateID(m.ID); err != nil {
		return err
	}
	if err := m.Role.Validate(); err != nil {
		return errors.Wrapf(err, "member %q", m.ID)
	}
	if err := ValidateAddr(m.Addr); err != nil {
		return errors.Wrapf(err, "member %q", m.ID)
	}
	switch m.Role {
	case RolePrefill:
		if err := validateSegment("CP group", m.Group); err != nil {
			return errors.Wrapf(err, "member %q", m.ID)
		}
		if m.Size < 1 || m.Size > MaxCPSize || m.Rank < 0 || m.Rank >= m.Size {
			return errors.Mark(errors.Newf("member %q: CP rank %d of size %d (want 0 <= rank < size <= %d)", m.ID, m.Rank, m.Size, MaxCPSize), ErrInvalid)
		}
	case RoleDecode:
		if m.Group != "" || m.Rank != 0 || m.Size != 0 {
			return errors.Mark(errors.Newf("member %q: a decode instance has no CP group (group %q, rank %d, size %d)", m.ID, m.Group, m.Rank, m.Size), ErrInvalid)
		}
	}
	return nil
}

// ValidateID checks a member id (see Member.ID).
func ValidateID(id string) error { return validateSegment("member id", id) }

func validateSegment(what, s string) error {
	if s == "" {
		return errors.Mark(errors.Newf("empty %s", what), ErrInvalid)
	}
	if len(s) > MaxIDLen {
		return errors.Mark(errors.Newf("%s %q: longer than %d bytes", what, s, MaxIDLen), ErrInvalid)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return errors.Mark(errors.Newf("%s %q: byte %q at %d (want letters, digits, '.', '_', '-')", what, s, c, i), ErrInvalid)
		}
	}
	return nil
}

// ValidateAddr checks a control-plane address: host:port with a non-empty
// host that is not a wildcard, and a port in 1..65535. A wildcard or port 0
// is a listen address, not one a peer can dial.
func ValidateAddr(addr string) error { return checkAddr(addr, false) }

func checkAddr(addr string, wildcardOK bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.Mark(errors.Wrapf(err, "address %q", addr), ErrInvalid)
	}
	if host == "" || strings.ContainsAny(host, " /") {
		return errors.Mark(errors.Newf("address %q: bad host %q", addr, host), ErrInvalid)
	}
	if ip := net.ParseIP(host); !wildcardOK && ip != nil && ip.IsUnspecified() {
		return errors.Mark(errors.Newf("address %q: wildcard host %q is not dialable", addr, host), ErrInvalid)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return errors.Mark(errors.Newf("address %q: bad port %q (want 1..65535)", addr, port), ErrInvalid)
	}
	return nil
}

// EventKind says whether a member joined or left.
type EventKind int

const (
	// Joined: the member registered, or its record changed (a rejoin with a
	// new address); the event carries the current record.
	Joined EventKind = iota + 1
	// Left: the member closed, or its lease expired; the event carries its
	// last record.
	Left
)

func (k EventKind) String() string {
	switch k {
	case Joined:
		return "joined"
	case Left:
		return "left"
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

// Event is one membership change seen by a watch.
type Event struct {
	Kind   EventKind
	Member Member
}

// Group returns the prefill ranks of one CP group from a listing, ordered by
// rank, once the group is complete: every rank of [0, size) present exactly
// once, all with the same size. A decode instance uses it to know which
// ranks must report for a request; a launcher, to know the group is up.
// An incomplete group is an error marked ErrNotFound naming the missing
// ranks; an inconsistent one (two sizes, a rank twice) is marked ErrInvalid.
func Group(members []Member, group string) ([]Member, error) {
	var ranks []Member
	for _, m := range members {
		if m.Role == RolePrefill && m.Group == group {
			ranks = append(ranks, m)
		}
	}
	if len(ranks) == 0 {
		return nil, errors.Mark(errors.Newf("CP group %q: no rank registered", group), ErrNotFound)
	}
	size := ranks[0].Size
	if size < 1 || size > MaxCPSize {
		return nil, errors.Mark(errors.Newf("CP group %q: member %q says size %d (want 1..%d)", group, ranks[0].ID, size, MaxCPSize), ErrInvalid)
	}
	byRank := make([]*Member, size)
	for i := range ranks {
		m := &ranks[i]
		if m.Size != size {
			return nil, errors.Mark(errors.Newf("CP group %q: rank %q says size %d, rank %q says %d", group, ranks[0].ID, size, m.ID, m.Size), ErrInvalid)
		}
		if m.Rank < 0 || m.Rank >= size {
			return nil, errors.Mark(errors.Newf("CP group %q: member %q has rank %d of size %d", group, m.ID, m.Rank, size), ErrInvalid)
		}
		if prev := byRank[m.Rank]; prev != nil {
			return nil, errors.Mark(errors.Newf("CP group %q: rank %d registered twice (%q, %q)", group, m.Rank, prev.ID, m.ID), ErrInvalid)
		}
		byRank[m.Rank] = m
	}
	out := make([]Member, 0, size)
	var missing []int
	for r, m := range byRank {
		if m == nil {
			missing = append(missing, r)
			continue
		}
		out = append(out, *m)
	}
	if len(missing) > 0 {
		return nil, errors.Mark(errors.Newf("CP group %q of size %d: ranks %v not registered", group, size, missing), ErrNotFound)
	}
	return out, nil
}
