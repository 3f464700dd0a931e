// circuit_view: a circuit as an SVG graph laid out in Python (rows from the input at the bottom to the
// logits at the top). Hovering a node or an edge, or focusing a head, says its scores in the status line;
// clicking a head with a pattern (or Enter / Space on it) shows its attention below, drawn by the
// attention view itself.
lib.kinds.circuit = function (root, data) {
  var nodeWidth = data.nodeSize[0], nodeHeight = data.nodeSize[1];
  var LABEL_CHARS = 9;   // longer names are cut in the box; the whole name is in its tooltip

  var svg = lib.svg, tooltip = lib.svgTooltip, label = lib.svgLabel;

  var graph = svg("svg", {"class": "itv-circuit", width: data.width, height: data.height,
                          viewBox: "0 0 " + data.width + " " + data.height, role: "group",
                          "aria-label": data.title});
  data.rows.forEach(function (row) {
    graph.appendChild(label(4, row.y, row.label, {"class": "itv-row-label", "dominant-baseline": "middle"}));
  });

  var edgeLayer = svg("g"), nodeLayer = svg("g");
  graph.appendChild(edgeLayer);
  graph.appendChild(nodeLayer);
  var edgeElements = data.edges.map(function (edge, index) {
    var group = svg("g", {"class": "itv-edge", "data-edge": index, "data-upstream": edge.upstream,
                          "data-reader": edge.reader, "data-mean": edge.mean}, [
      svg("path", {"class": "itv-edge-hit", d: edge.path, "stroke-width": Math.max(10, edge.width)}),
      svg("path", {"class": "itv-edge-line", d: edge.path, stroke: edge.colour, "stroke-width": edge.width}),
      tooltip(edge.title)
    ]);
    edgeLayer.appendChild(group);
    return group;
  });

  var headNodes = {};   // pattern index -> the node's element
  var nodeElements = {};
  data.nodes.forEach(function (node) {
    var text = node.id.length > LABEL_CHARS ? node.id.slice(0, LABEL_CHARS - 1) + "\u2026" : node.id;
    var group = svg("g", {"class": "itv-node itv-kind-" + node.kind, "data-node": node.id,
                          transform: "translate(" + (node.x - nodeWidth / 2) + " " + (node.y - nodeHeight / 2) + ")"}, [
      svg("rect", {width: nodeWidth, height: nodeHeight, rx: 4}),
      label(nodeWidth / 2, nodeHeight / 2, text, {"text-anchor": "middle", "dominant-baseline": "central"}),
      tooltip(node.title + (node.pattern !== null ? ". Click for its attention pattern." : ""))
    ]);
    node.ports.forEach(function (port, i) {
      var x = nodeWidth / 2 + (i === 0 ? -1 : 1) * nodeWidth / 4;
      group.appendChild(label(x + 5, nodeHeight + 9, port, {"class": "itv-port"}));
    });
    if (node.pattern !== null) {
      group.setAttribute("class", group.getAttribute("class") + " itv-has-pattern");
      group.setAttribute("tabindex", "0");
      group.setAttribute("role", "button");
      group.setAttribute("aria-pressed", "false");
      group.setAttribute("aria-label", node.title + ". Press to show its attention pattern.");
      group.setAttribute("data-pattern", node.pattern);
      group.addEventListener("click", function () { showPattern(node.pattern); });
      group.addEventListener("keydown", function (event) {
        if (event.key !== "Enter" && event.key !== " ") return;
        event.preventDefault();
        showPattern(node.pattern);
      });
      headNodes[node.pattern] = group;
    }
    nodeElements[node.id] = {node: node, element: group};
    nodeLayer.appendChild(group);
  });

  var hint = data.attention ? " Click a head with a thick border for its attention on prompt " + data.prompt + "." : "";
  var status = lib.status();
  function idle() { status.textContent = "Hover a node or an edge for its scores." + hint; }

  lib.edgeFocus(graph, data.edges, edgeElements, status, idle, function (edge) { return edge.title; },
                function (id) { return nodeElements[id].node; });

  var legend = lib.edgeLegend(data.legend, "mean score", "positive",
                              "negative; width grows with |mean|, the widest " + data.legend.strongest);

  var panel = el("div", {"class": "itv-circuit-pattern", hidden: true});
  var attentionRoot = null;
  function showPattern(index) {
    if (!attentionRoot) {
      attentionRoot = el("div", {id: lib.uniqueId(root, "attention")});
      var heading = "Attention on prompt " + data.prompt + " (choose a head in the graph or here)";
      panel.appendChild(el("div", {"class": "itv-enlarged-title", text: heading}));
      panel.appendChild(attentionRoot);
      lib.kinds.attention(attentionRoot, data.attention);
      attentionRoot.querySelector("select").addEventListener("change", function (event) {
        markHead(Number(event.target.value));
      });
    }
    var select = attentionRoot.querySelector("select");
    select.value = String(index);
    select.dispatchEvent(new Event("change"));
    panel.hidden = false;
  }
  function markHead(index) {
    Object.keys(headNodes).forEach(function (key) {
      headNodes[key].setAttribute("aria-pressed", Number(key) === index ? "true" : "false");
    });
    root.setAttribute("data-selected", data.attention.heads[index]);
  }

  root.appendChild(el("div", {"class": "itv-circuit-title", text: data.title}));
  root.appendChild(el("div", {"class": "itv-circuit-scroll"}, [graph]));
  root.appendChild(legend);
  root.appendChild(status);
  root.appendChild(panel);
  idle();
};
