"""Interactive views of text, for notebooks and HTML pages, that work offline.

- ``attention_view(tokens, pattern)``: the text coloured by one head's attention
  from (or to) the token under the pointer; a head menu; all heads side by side.
- ``activation_view(tokens, values, names)``: the text coloured by a per-token value
  (neurons, SAE features), one column at a time, the value on hover.
- ``pattern_grid(pattern, tokens)``: every head's ``[query_pos, key_pos]`` pattern as a
  thumbnail; clicking one enlarges it with token labels and values on hover.
- ``circuit_view(edge_scores, kept)``: a circuit's edges as a graph from the input to the logits,
  scores on hover; clicking a head shows its attention pattern on the prompt.

Each returns a ``View``: shown inline by Jupyter and VS Code (``_repr_html_``), written
as a standalone page by ``save``, embedded in a larger page by ``to_html()``. The HTML
holds its data and its own small script: no CDN, no font, no request of any kind.
"""

from .activations import activation_view
from .attention import attention_view
from .circuit import circuit_view
from .grid import pattern_grid
from .view import View, library_script, page_html, save_page

__all__ = [
    "View",
    "activation_view",
    "attention_view",
    "circuit_view",
    "library_script",
    "page_html",
    "pattern_grid",
    "save_page",
]
