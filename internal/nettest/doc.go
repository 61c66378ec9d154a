// Package nettest gives tests TCP addresses where nothing listens and
// nothing else can start to: ports held by internal/portlease until the
// test ends (see there why listening on port 0 and closing does not do).
package nettest
