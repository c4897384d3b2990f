// MathJax configuration for pymdownx.arithmatex (generic mode); MathJax itself is vendored
// in javascripts/mathjax/ so that the docs render their math offline
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true
  },
  svg: { fontCache: "global" },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex"
  }
};
