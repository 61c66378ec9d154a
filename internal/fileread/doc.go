// Package fileread reads a file named by a flag within a bound, so that an
// endless or huge file (/dev/zero given as a key, a report) is refused at
// the bound instead of read whole into memory.
package fileread
