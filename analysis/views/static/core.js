// Shared helpers of the views. Runs inside a function that receives `lib` (the
// global library object), `CSS` (views.css as a string) and PENDING_NAME (the
// global list of views waiting to be mounted). Colour arithmetic mirrors
// analysis/views/colours.py: the scales come from Python as data.
"use strict";

var MOUNT_RETRIES = 200;   // x 50 ms: a notebook may attach an output to the page a little after running its script
var DARK_BACKGROUND = 0.179;   // colours.DARK_BACKGROUND

function el(tag, attrs, children) {
  var node = document.createElement(tag);
  Object.keys(attrs || {}).forEach(function (name) {
    var value = attrs[name];
    if (value === false || value === null || value === undefined) return;
    if (name === "text") node.textContent = value;
    else node.setAttribute(name, value === true ? "" : String(value));
  });
  (children || []).forEach(function (child) {
    node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
  });
  return node;
}
lib.el = el;

var uniqueCounter = 0;
lib.uniqueId = function (root, what) {
  uniqueCounter += 1;
  return root.id + "-" + what + "-" + uniqueCounter;
};

lib.colour = function (value, scale) {
  var t = (value - scale.min) / (scale.max - scale.min);
  t = Math.min(1, Math.max(0, t));
  var stops = scale.stops;
  for (var i = 1; i < stops.length; i++) {
    if (t <= stops[i][0]) {
      var t0 = stops[i - 1][0], t1 = stops[i][0];
      var f = t1 === t0 ? 0 : (t - t0) / (t1 - t0);
      var a = stops[i - 1][1], b = stops[i][1];
      return [0, 1, 2].map(function (c) { return Math.round(a[c] + (b[c] - a[c]) * f); });
    }
  }
  return stops[stops.length - 1][1].slice();
};

function luminance(rgb) {
  var lin = rgb.map(function (channel) {
    var c = channel / 255;
    return c <= 0.04045 ? c / 12.92 : Math.pow((c + 0.055) / 1.055, 2.4);
  });
  return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2];
}

function cssColour(rgb) { return "rgb(" + rgb.join(", ") + ")"; }

// Colour `node` for `value` on `scale`, with text that stays readable on it.
lib.paint = function (node, value, scale) {
  var rgb = lib.colour(value, scale);
  node.style.backgroundColor = cssColour(rgb);
  node.style.color = luminance(rgb) < DARK_BACKGROUND ? "#ffffff" : "#000000";
  node.setAttribute("data-value", String(value));
};

lib.gradient = function (scale) {
  return "linear-gradient(to right, " + scale.stops.map(function (stop) {
    return cssColour(stop[1]) + " " + (100 * stop[0]) + "%";
  }).join(", ") + ")";
};

// A colour bar with its range, e.g. "0 [bar] 1" or "-2.5 [bar] 0 ... 2.5".
lib.legend = function (scale, caption) {
  var bar = el("span", {"class": "itv-legend-bar", "aria-hidden": "true"});
  bar.style.background = lib.gradient(scale);
  return el("div", {"class": "itv-legend"}, [
    el("span", {"class": "itv-legend-caption", text: caption}),
    el("span", {"class": "itv-legend-range"}, [el("span", {text: String(scale.min)}), bar, el("span", {text: String(scale.max)})])
  ]);
};

// How a token is shown: newlines and tabs made visible, an empty token as a small mark.
lib.tokenLabel = function (token) {
  if (token === "") return "\u2205";
  return token.replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5");
};

// How a token is quoted in sentences and tooltips.
lib.quote = function (token) { return JSON.stringify(token); };

lib.describeToken = function (tokens, pos) { return lib.quote(tokens[pos]) + " (pos " + pos + ")"; };

// The text as one row of token spans. With `options.interactive`, it is a listbox:
// one tab stop, arrow keys / Home / End move between tokens, focus or hover calls
// onPreview(pos), leaving calls onPreview(null), click / Enter / Space call onSelect(pos).
lib.tokenRow = function (tokens, options) {
  options = options || {};
  var row = el("div", {"class": "itv-tokens"});
  var spans = tokens.map(function (token, pos) {
    var span = el("span", {"class": "itv-token", "data-pos": pos, text: lib.tokenLabel(token)});
    row.appendChild(span);
    if (token.indexOf("\n") >= 0) row.appendChild(el("br"));
    return span;
  });
  if (!options.interactive) return {element: row, spans: spans};

  row.setAttribute("role", "listbox");
  row.setAttribute("aria-label", options.label || "tokens");
  var current = Math.max(0, Math.min(tokens.length - 1, options.focusPos || 0));
  spans.forEach(function (span, pos) {
    span.setAttribute("role", "option");
    span.setAttribute("tabindex", pos === current ? "0" : "-1");
    span.setAttribute("aria-selected", "false");
  });
  function moveTo(pos) {
    spans[current].setAttribute("tabindex", "-1");
    current = pos;
    spans[current].setAttribute("tabindex", "0");
    spans[current].focus();
  }
  function posOf(target) {
    var span = target && target.closest ? target.closest(".itv-token") : null;
    return span && row.contains(span) ? Number(span.getAttribute("data-pos")) : null;
  }
  row.addEventListener("mouseover", function (event) {
    var pos = posOf(event.target);
    if (pos !== null) options.onPreview(pos);
  });
  row.addEventListener("mouseleave", function () { options.onPreview(null); });
  row.addEventListener("focusin", function (event) {
    var pos = posOf(event.target);
    if (pos === null) return;
    if (pos !== current) { spans[current].setAttribute("tabindex", "-1"); current = pos; spans[pos].setAttribute("tabindex", "0"); }
    options.onPreview(pos);
  });
  row.addEventListener("focusout", function (event) {
    if (!row.contains(event.relatedTarget)) options.onPreview(null);
  });
  row.addEventListener("click", function (event) {
    var pos = posOf(event.target);
    if (pos === null) return;
    moveTo(pos);
    options.onSelect(pos);
  });
  row.addEventListener("keydown", function (event) {
    var moves = {ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1};
    if (event.key in moves) moveTo(Math.max(0, Math.min(tokens.length - 1, current + moves[event.key])));
    else if (event.key === "Home") moveTo(0);
    else if (event.key === "End") moveTo(tokens.length - 1);
    else if (event.key === "Enter" || event.key === " ") options.onSelect(current);
    else return;
    event.preventDefault();
  });
  return {
    element: row,
    spans: spans,
    markSelected: function (pos) {
      spans.forEach(function (span, p) { span.setAttribute("aria-selected", p === pos ? "true" : "false"); });
    }
  };
};

// A labelled <select>; onChange receives the chosen index.
lib.select = function (root, caption, names, index, onChange) {
  var id = lib.uniqueId(root, "select");
  var select = el("select", {id: id});
  names.forEach(function (name, i) { select.appendChild(el("option", {value: i, text: name})); });
  select.value = String(index);
  select.addEventListener("change", function () { onChange(Number(select.value)); });
  return {element: el("span", {"class": "itv-field"}, [el("label", {"for": id, text: caption}), select]), select: select};
};

// A line that says what is shown; screen readers announce its changes.
lib.status = function () {
  return el("div", {"class": "itv-status", "aria-live": "polite"});
};

// Hovering or focusing a node of ``drawing`` lights its edges and fades the rest; an edge lights itself (the circuit
// and the attribution graph). ``edgeElements[i]`` draws ``edges[i]``; ``status`` shows ``edgeTitle(edge)`` or the
// node's title (``nodeOf(id)``: the node, {id, title}, of a [data-node] element); ``idle()`` resets it.
lib.edgeFocus = function (drawing, edges, edgeElements, status, idle, edgeTitle, nodeOf) {
  function focusOn(content, lit) {
    status.textContent = content;
    drawing.classList.add("itv-focus");
    edgeElements.forEach(function (element, index) { element.classList.toggle("itv-lit", lit(edges[index])); });
  }
  function unfocus() {
    drawing.classList.remove("itv-focus");
    edgeElements.forEach(function (element) { element.classList.remove("itv-lit"); });
    idle();
  }
  function point(target) {
    var edge = target.closest ? target.closest("[data-edge]") : null;
    if (edge) {
      var one = edges[Number(edge.getAttribute("data-edge"))];
      focusOn(edgeTitle(one), function (other) { return other === one; });
      return;
    }
    var element = target.closest ? target.closest("[data-node]") : null;
    if (!element) { unfocus(); return; }
    var node = nodeOf(element.getAttribute("data-node"));
    focusOn(node.title, function (other) { return other.source === node.id || other.target === node.id; });
  }
  drawing.addEventListener("mouseover", function (event) { point(event.target); });
  drawing.addEventListener("mouseleave", unfocus);
  drawing.addEventListener("focusin", function (event) { point(event.target); });
  drawing.addEventListener("focusout", unfocus);
};

// The legend of a view that draws signed edges: ``caption``, then the colour of ``legend.positive`` with the text
// ``positive`` and that of ``legend.negative`` with ``negative``.
lib.edgeLegend = function (legend, caption, positive, negative) {
  function swatch(colour) {
    var mark = el("span", {"class": "itv-circuit-swatch", "aria-hidden": "true"});
    mark.style.background = colour;
    return mark;
  }
  return el("div", {"class": "itv-legend"}, [
    el("span", {text: caption}), swatch(legend.positive), el("span", {text: positive}),
    swatch(legend.negative), el("span", {text: negative})
  ]);
};

// views.css goes once into the document head, or into the shadow root that holds the view.
function injectStyle(root) {
  var container = root.getRootNode ? root.getRootNode() : document;
  var target = container === document || !container.host ? document.head : container;
  var existing = target.querySelector("style[data-itv-style]");
  if (existing && existing.getAttribute("data-itv-style") === lib.version) return;
  if (existing) existing.parentNode.removeChild(existing);
  var style = el("style", {"data-itv-style": lib.version});
  style.textContent = CSS;
  target.appendChild(style);
}

function mount(root) {
  if (root.getAttribute("data-itv-mounted") === lib.version) return;
  var data = JSON.parse(root.querySelector("script.itv-data").textContent);
  var kind = lib.kinds[data.kind];
  injectStyle(root);
  Array.prototype.slice.call(root.children).forEach(function (child) {
    if (!(child.tagName === "SCRIPT" && child.classList.contains("itv-data"))) root.removeChild(child);
  });
  try {
    if (!kind) throw new Error("unknown view kind " + JSON.stringify(data.kind));
    kind(root, data);
    root.setAttribute("data-itv-mounted", lib.version);
  } catch (error) {
    root.appendChild(el("p", {"class": "itv-error", text: "This view failed to draw: " + error}));
    console.error(error);
  }
}

function findRoot(entry) {
  var root = document.getElementById(entry.id);
  if (!root && entry.script && entry.script.parentNode) root = entry.script.parentNode.querySelector("#" + entry.id);
  return root;
}

var retryScheduled = false;
lib.mountPending = function () {
  var pending = window[PENDING_NAME] || [];
  window[PENDING_NAME] = [];
  pending.forEach(function (entry) {
    var root = findRoot(entry);
    if (root) mount(root);
    else if ((entry.tries = (entry.tries || 0) + 1) < MOUNT_RETRIES) window[PENDING_NAME].push(entry);
  });
  if (window[PENDING_NAME].length && !retryScheduled) {
    retryScheduled = true;
    setTimeout(function () { retryScheduled = false; lib.mountPending(); }, 50);
  }
};

// SVG elements, for the graph views. The namespace is taken from the HTML parser instead of spelled: the views'
// HTML names no URL at all.
var svgHolder = el("div");
svgHolder.innerHTML = "<svg></svg>";
var SVG_NS = svgHolder.firstChild.namespaceURI;

lib.svg = function (tag, attrs, children) {
  var node = document.createElementNS(SVG_NS, tag);
  Object.keys(attrs || {}).forEach(function (name) {
    if (attrs[name] !== null && attrs[name] !== undefined) node.setAttribute(name, String(attrs[name]));
  });
  (children || []).forEach(function (child) { node.appendChild(child); });
  return node;
};

lib.svgTooltip = function (text) {
  var title = lib.svg("title");
  title.textContent = text;
  return title;
};

lib.svgLabel = function (x, y, text, attrs) {
  var node = lib.svg("text", Object.assign({x: x, y: y}, attrs || {}));
  node.textContent = text;
  return node;
};
