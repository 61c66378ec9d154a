// Package stderrs makes cockroachdb error marks visible to the standard
// library's errors.Is: the public packages return their errors through
// Public, so that a caller may branch with either errors package.
package stderrs
