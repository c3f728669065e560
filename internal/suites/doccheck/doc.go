// Package doccheck holds the tests of the repository's Markdown
// documentation: every relative link and anchor resolves, and the docs
// speak in the project's voice. It has no code of its own.
package doccheck
