// graph_view: an attribution graph laid out in Python (analysis/attribution_graphs/view.py), rows from the
// embeddings (bottom) to the logits (top), columns the prompt's positions. Hovering a node says its value and
// influence; clicking it (or Enter / Space on it) lists its strongest kept edges and its feature information in
// the side panel; shift-click (or "p", or the panel's button) pins it. Features chosen for an intervention get
// the graph's linear predictions of each logit's change, and the command that runs the real intervention.
lib.kinds.attribution_graph = function (root, data) {
  var PINNED_STROKE = "#e8175d", SELECTED_STROKE = "#111111";

  var svg = lib.svg, tooltip = lib.svgTooltip, label = lib.svgLabel;
  function number(value) { return value === null || value === undefined ? "\u2014" : Number(value).toPrecision(4); }
  function short(content, chars) { return content.length > chars ? content.slice(0, chars - 1) + "\u2026" : content; }

  var nodes = {}, into = {}, outOf = {};
  data.nodes.forEach(function (node) { nodes[node.id] = node; into[node.id] = []; outOf[node.id] = []; });
  data.edges.forEach(function (edge) { into[edge.target].push(edge); outOf[edge.source].push(edge); });
  function strongest(edges) {
    return edges.slice().sort(function (a, b) { return Math.abs(b.weight) - Math.abs(a.weight); }).slice(0, data.topEdges);
  }
  function edgeTitle(edge) {
    return nodes[edge.source].label + " \u2192 " + nodes[edge.target].label + ": " + number(edge.weight);
  }

  // --- the drawing ----------------------------------------------------------------------------------------------
  var drawing = svg("svg", {"class": "itv-circuit itv-graph", width: data.width, height: data.height,
                            viewBox: "0 0 " + data.width + " " + data.height, role: "group", "aria-label": data.title});
  data.rows.forEach(function (row) {
    drawing.appendChild(label(4, row.y, row.label, {"class": "itv-row-label", "dominant-baseline": "middle"}));
  });
  var bottom = data.rows[0].y;
  data.columns.forEach(function (column) {
    var token = label(column.x, bottom + 26, short(lib.tokenLabel(column.token), 10), {"text-anchor": "middle"});
    token.appendChild(tooltip("pos " + column.pos + ": " + lib.quote(column.token)));
    drawing.appendChild(token);
  });
  var edgeLayer = svg("g"), nodeLayer = svg("g");
  drawing.appendChild(edgeLayer);
  drawing.appendChild(nodeLayer);

  var edgeElements = data.edges.map(function (edge, index) {
    var source = nodes[edge.source], target = nodes[edge.target];
    var x1 = source.x, y1 = source.y - source.radius, x2 = target.x, y2 = target.y + target.radius;
    var bend = Math.max(16, Math.abs(y1 - y2) / 2);
    var path = "M" + x1 + " " + y1 + " C" + x1 + " " + (y1 - bend) + " " + x2 + " " + (y2 + bend) + " " + x2 + " " + y2;
    var group = svg("g", {"class": "itv-edge", "data-edge": index, "data-source": edge.source,
                          "data-target": edge.target, "data-weight": edge.weight}, [
      svg("path", {"class": "itv-edge-hit", d: path, "stroke-width": Math.max(8, edge.width)}),
      svg("path", {"class": "itv-edge-line", d: path, stroke: edge.colour, "stroke-width": edge.width, opacity: 0.75}),
      tooltip(edgeTitle(edge))
    ]);
    edgeLayer.appendChild(group);
    return group;
  });

  function shapeOf(node) {
    var x = node.x, y = node.y, r = node.radius;
    if (node.shape === "square") return svg("rect", {x: x - r, y: y - r, width: 2 * r, height: 2 * r});
    if (node.shape === "diamond") return svg("polygon", {points: [x, y - r, x + r, y, x, y + r, x - r, y].join(" ")});
    if (node.shape === "triangle-up") return svg("polygon", {points: [x, y - r, x + r, y + r, x - r, y + r].join(" ")});
    return svg("circle", {cx: x, cy: y, r: r});
  }
  var nodeElements = {};
  data.nodes.forEach(function (node) {
    var shape = shapeOf(node);
    shape.setAttribute("style", "fill:" + node.colour);
    var group = svg("g", {"class": "itv-gnode", "data-node": node.id, "data-kind": node.kind, tabindex: 0,
                          role: "button", "aria-pressed": "false", "aria-label": node.title, cursor: "pointer"},
                    [shape, tooltip(node.title + ". Click for its edges; shift-click to pin.")]);
    if (node.kind === "logit") {
      var name = short(node.label.replace(/^logit /, ""), 12);
      group.appendChild(label(node.x + 2, node.y - node.radius - 4, name, {transform: "rotate(-40 " + (node.x + 2) +
                                                                           " " + (node.y - node.radius - 4) + ")"}));
    }
    nodeElements[node.id] = {group: group, shape: shape};
    nodeLayer.appendChild(group);
  });

  // --- state: the selected node, the pinned ones, the features chosen for an intervention ----------------------
  var selected = null, pinned = [], chosen = [], pinnedOnly = false;
  function toggle(list, id) {
    var at = list.indexOf(id);
    if (at >= 0) list.splice(at, 1); else list.push(id);
  }

  var status = lib.status();
  function idle() { status.textContent = "Hover a node for its value and influence; click it for its edges."; }
  lib.edgeFocus(drawing, data.edges, edgeElements, status, idle, edgeTitle, function (id) { return nodes[id]; });
  drawing.addEventListener("click", function (event) {
    var element = event.target.closest ? event.target.closest("[data-node]") : null;
    if (!element) return;
    var id = element.getAttribute("data-node");
    if (event.shiftKey) toggle(pinned, id); else selected = id;
    refresh();
  });
  drawing.addEventListener("keydown", function (event) {
    var element = event.target.closest ? event.target.closest("[data-node]") : null;
    if (!element) return;
    var id = element.getAttribute("data-node");
    if (event.key === "Enter" || event.key === " ") selected = id;
    else if (event.key === "p") toggle(pinned, id);
    else return;
    event.preventDefault();
    refresh();
  });

  // --- the side panel ----------------------------------------------------------------------------------------------
  var panel = el("div", {"class": "itv-graph-panel", "aria-live": "polite"});
  panel.setAttribute("style", "flex:0 0 22rem;max-width:100%;max-height:" + Math.max(480, data.height) +
                     "px;overflow:auto;border:1px solid #ccc;border-radius:4px;padding:.4rem .6rem;font-size:.85em");
  function button(content, onClick, attrs) {
    var node = el("button", Object.assign({type: "button", text: content}, attrs || {}));
    node.addEventListener("click", onClick);
    return node;
  }
  function heading(content) { return el("div", {style: "font-weight:600;margin-top:.5rem", text: content}); }
  function edgeTable(edges, end, what) {
    var all = (end === "source" ? into : outOf)[selected];
    var rows = strongest(edges).map(function (edge) {
      var other = edge[end];
      return el("tr", {"data-node": other, "data-weight": edge.weight}, [
        el("td", {}, [button(short(nodes[other].label, 28), function () { selected = other; refresh(); },
                             {title: nodes[other].title, style: "font:inherit;text-align:left"})]),
        el("td", {style: "text-align:right;color:" + edge.colour, text: number(edge.weight)})
      ]);
    });
    var caption = what + " (" + rows.length + " of " + all.length + ", by |weight|)";
    if (!rows.length) return [heading(what + ": none kept")];
    return [heading(caption), el("table", {"class": "itv-graph-" + (end === "source" ? "in" : "out")}, rows)];
  }
  function pairTable(pairs, className, monospace) {
    return el("table", {"class": className}, pairs.map(function (pair) {
      return el("tr", {"data-value": pair[1]}, [
        el("td", {style: monospace ? "font-family:monospace;white-space:pre-wrap" : "", text: lib.tokenLabel(pair[0])}),
        el("td", {style: "text-align:right", text: number(pair[1])})
      ]);
    }));
  }
  function renderPanel() {
    panel.textContent = "";
    if (selected === null) {
      panel.appendChild(el("p", {text: "Click a node for its strongest kept edges" +
                                        (Object.keys(data.featureInfo).length ? " and its feature's top activations." : ".")}));
      return;
    }
    var node = nodes[selected];
    panel.appendChild(el("div", {"class": "itv-enlarged-title", text: node.label + " (" + node.id + ")"}));
    panel.appendChild(el("div", {text: node.title}));
    var isPinned = pinned.indexOf(node.id) >= 0;
    var controls = [button(isPinned ? "Unpin" : "Pin", function () { toggle(pinned, node.id); refresh(); },
                           {"class": "itv-graph-pin"})];
    if (node.kind === "feature") {
      controls.push(button(chosen.indexOf(node.id) >= 0 ? "Remove from intervention" : "Add to intervention",
                           function () { toggle(chosen, node.id); refresh(); }, {"class": "itv-graph-choose"}));
    }
    panel.appendChild(el("div", {"class": "itv-controls", style: "margin-top:.3rem"}, controls));
    edgeTable(into[selected], "source", "Incoming kept edges").forEach(function (n) { panel.appendChild(n); });
    edgeTable(outOf[selected], "target", "Outgoing kept edges").forEach(function (n) { panel.appendChild(n); });
    if (node.kind !== "feature") return;
    var info = node.info === null ? null : data.featureInfo[node.info];
    if (!info) {
      panel.appendChild(el("p", {text: "No feature information was given for this feature (feature_info)."}));
      return;
    }
    panel.appendChild(heading("Top activations"));
    panel.appendChild(pairTable(info.top_activations, "itv-graph-activations", true));
    panel.appendChild(heading("Logits it raises most"));
    panel.appendChild(pairTable(info.top_logits, "itv-graph-top-logits", false));
    panel.appendChild(heading("Logits it lowers most"));
    panel.appendChild(pairTable(info.bottom_logits, "itv-graph-bottom-logits", false));
  }

  // --- pinned nodes ------------------------------------------------------------------------------------------------
  var pinnedBoxId = lib.uniqueId(root, "pinned");
  var pinnedBox = el("textarea", {id: pinnedBoxId, "class": "itv-graph-pinned", readonly: true, rows: 2,
                                  style: "width:100%;font-family:monospace"});
  pinnedBox.addEventListener("focus", function () { pinnedBox.select(); });
  var onlyId = lib.uniqueId(root, "only");
  var only = el("input", {type: "checkbox", id: onlyId, "class": "itv-graph-only"});
  only.addEventListener("change", function () { pinnedOnly = only.checked; refresh(); });
  var pinnedSection = el("div", {style: "margin-top:.5rem"}, [
    el("div", {"class": "itv-controls"}, [
      el("span", {"class": "itv-field"}, [only, el("label", {"for": onlyId, text: "show pinned subgraph"})]),
      button("Clear pins", function () { pinned = []; refresh(); }, {"class": "itv-graph-clear-pins"})
    ]),
    el("label", {"for": pinnedBoxId, text: "Pinned node ids (shift-click a node to pin it), to copy:"}),
    pinnedBox
  ]);

  // --- interventions -------------------------------------------------------------------------------------------------
  var mode = "ablate";
  var modeName = lib.uniqueId(root, "mode");
  var scaleInput = el("input", {type: "number", step: "0.1", value: "2", "class": "itv-graph-scale",
                                "aria-label": "scale factor", style: "width:5rem"});
  function radio(value, caption, extra) {
    var id = lib.uniqueId(root, "mode-" + value);
    var input = el("input", {type: "radio", name: modeName, value: value, id: id, checked: value === mode});
    input.addEventListener("change", function () { if (input.checked) { mode = value; refresh(); } });
    return el("span", {"class": "itv-field"}, [input, el("label", {"for": id, text: caption})].concat(extra || []));
  }
  scaleInput.addEventListener("input", function () { if (mode === "scale") refresh(); });
  var chosenLine = el("div", {"class": "itv-graph-chosen"});
  var predictions = el("table", {"class": "itv-graph-predictions"});
  var command = el("textarea", {"class": "itv-graph-command", readonly: true, rows: 2, "aria-label": "command line",
                                style: "width:100%;font-family:monospace"});
  command.addEventListener("focus", function () { command.select(); });
  var interventionSection = el("div", {style: "margin-top:.6rem"}, [
    el("div", {"class": "itv-enlarged-title", text: "Intervention on chosen features"}),
    chosenLine,
    el("div", {"class": "itv-controls"}, [
      button("Use pinned features", function () {
        pinned.forEach(function (id) { if (nodes[id].kind === "feature" && chosen.indexOf(id) < 0) chosen.push(id); });
        refresh();
      }, {"class": "itv-graph-use-pinned"}),
      button("Clear", function () { chosen = []; refresh(); }, {"class": "itv-graph-clear-chosen"}),
      radio("ablate", "ablate (scale 0)"),
      radio("scale", "scale by", [scaleInput])
    ]),
    predictions,
    el("label", {text: "The real intervention, on the model (a scale sets each activation to scale \u00d7 its value):"}),
    command
  ]);

  function scale() { return mode === "ablate" ? 0 : Number(scaleInput.value); }
  function renderIntervention() {
    chosenLine.textContent = chosen.length ? "Chosen: " + chosen.join(", ") :
      "No feature chosen: add features from the side panel, or use the pinned ones.";
    predictions.textContent = "";
    command.value = "";
    var c = scale();
    if (!chosen.length || !isFinite(c) || scaleInput.value === "" && mode === "scale") return;
    predictions.appendChild(el("tr", {}, [
      el("th", {text: "logit"}), el("th", {text: "direct (frozen features)"}), el("th", {text: "through features (linear)"})
    ]));
    data.logits.forEach(function (logit, j) {
      var direct = 0, total = 0;
      chosen.forEach(function (id) { direct += nodes[id].direct[j]; total += nodes[id].total[j]; });
      direct *= c - 1;
      total *= c - 1;
      predictions.appendChild(el("tr", {"data-logit": logit.id}, [
        el("td", {text: logit.label}),
        el("td", {"class": "itv-graph-direct", "data-value": direct, style: "text-align:right", text: number(direct)}),
        el("td", {"class": "itv-graph-total", "data-value": total, style: "text-align:right", text: number(total)})
      ]));
    });
    var specs = c === 0 ? chosen : chosen.map(function (id) {
      return id + "=" + String(Number((c * nodes[id].value).toPrecision(6)));   // view.py's _short_number
    });
    command.value = data.command.prefix + " " + (c === 0 ? data.command.ablate : data.command.steer) + " " +
      specs.join(" ");
  }

  function refresh() {
    Object.keys(nodeElements).forEach(function (id) {
      var parts = nodeElements[id], isPinned = pinned.indexOf(id) >= 0;
      parts.shape.setAttribute("stroke", id === selected ? SELECTED_STROKE : isPinned ? PINNED_STROKE : "#ffffff");
      parts.shape.setAttribute("stroke-width", id === selected || isPinned ? 3 : 1);
      parts.group.setAttribute("aria-pressed", id === selected ? "true" : "false");
      parts.group.setAttribute("data-pinned", isPinned ? "true" : "false");
      parts.group.style.display = pinnedOnly && !isPinned ? "none" : "";
    });
    edgeElements.forEach(function (element, index) {
      var edge = data.edges[index];
      var shown = !pinnedOnly || (pinned.indexOf(edge.source) >= 0 && pinned.indexOf(edge.target) >= 0);
      element.style.display = shown ? "" : "none";
    });
    root.setAttribute("data-selected", selected === null ? "" : selected);
    root.setAttribute("data-pinned", pinned.join(","));
    pinnedBox.value = pinned.join(",");
    renderPanel();
    renderIntervention();
  }

  var legend = lib.edgeLegend(data.legend, "edge", "raises its target",
                              "lowers it; width grows with |weight|, the widest " + number(data.legend.strongest));
  var scroll = el("div", {"class": "itv-circuit-scroll", style: "flex:1 1 30rem;min-width:0"}, [drawing]);
  root.appendChild(el("div", {"class": "itv-circuit-title", text: data.title}));
  root.appendChild(el("div", {style: "display:flex;flex-wrap:wrap;gap:.8rem;align-items:flex-start"}, [scroll, panel]));
  root.appendChild(legend);
  root.appendChild(status);
  root.appendChild(pinnedSection);
  root.appendChild(interventionSection);
  idle();
  refresh();
};
