// MathJax configuration (MathJax itself is vendored in javascripts/mathjax/, so that the docs
// render their math offline). Three sources of math are typeset:
// - the Markdown pages: pymdownx.arithmatex (generic mode) wraps each formula, \( \) or \[ \],
//   in an element of class "arithmatex";
// - the notebook pages (mkdocs-jupyter): the notebooks' Markdown keeps $ $ and $$ $$, inside
//   elements of class "jp-RenderedMarkdown";
// - the table of contents and the navigation, whose entries ("md-ellipsis") carry a heading's
//   text with its TeX but without the arithmatex element around it.
// Everything else (code, printed outputs) is left alone: an element with a class is ignored with
// its descendants unless its class is one of those three, and an element without a class
// inherits its parent's choice (so the paragraphs and headings of a notebook's Markdown are
// typeset, the code spans and anchors inside them not).
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"], ["$", "$"]],
    displayMath: [["\\[", "\\]"], ["$$", "$$"]],
    processEscapes: true,
    processEnvironments: true
  },
  svg: { fontCache: "global" },
  options: {
    ignoreHtmlClass: ".+",
    processHtmlClass: "arithmatex|jp-RenderedMarkdown|md-ellipsis"
  }
};
