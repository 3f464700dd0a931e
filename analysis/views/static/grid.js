// pattern_grid: a thumbnail of every head's [query_pos, key_pos] pattern; clicking one
// (or Enter / Space on it) enlarges it with token labels on both axes and values on hover.
lib.kinds.grid = function (root, data) {
  var tokens = data.tokens, pattern = data.pattern, heads = data.heads, scale = data.scale;
  var n = tokens.length;

  // One cell per query_pos (row) and key_pos (column), `cell` pixels wide, colours exact (no smoothing).
  // Thumbnails (one pixel a cell) are written as raw pixels: a rectangle per cell is slow for long texts.
  function drawPattern(canvas, matrix, cell) {
    canvas.width = canvas.height = n * cell;
    var ctx = canvas.getContext("2d");
    if (cell === 1) {
      var image = ctx.createImageData(n, n);
      for (var i = 0; i < n * n; i++) {
        var rgb = lib.colour(matrix[Math.floor(i / n)][i % n], scale);
        image.data.set([rgb[0], rgb[1], rgb[2], 255], 4 * i);
      }
      ctx.putImageData(image, 0, 0);
      return;
    }
    for (var q = 0; q < n; q++) {
      for (var k = 0; k < n; k++) {
        ctx.fillStyle = "rgb(" + lib.colour(matrix[q][k], scale).join(", ") + ")";
        ctx.fillRect(k * cell, q * cell, cell, cell);
      }
    }
  }

  var thumbs = el("div", {"class": "itv-thumbs", role: "group", "aria-label": "heads: press one to enlarge it"});
  var buttons = heads.map(function (name, head) {
    var canvas = el("canvas", {"aria-hidden": "true"});
    drawPattern(canvas, pattern[head], 1);
    var button = el("button", {type: "button", "class": "itv-thumb", "data-head": head, "aria-pressed": "false",
                                title: "enlarge " + name}, [canvas, el("span", {text: name})]);
    button.addEventListener("click", function () { enlarge(head); });
    thumbs.appendChild(button);
    return button;
  });
  var panel = el("div", {"class": "itv-enlarged", hidden: true});
  var hint = el("div", {"class": "itv-status", text: "Press a head to enlarge its pattern."});

  function enlarge(head) {
    buttons.forEach(function (button, h) { button.setAttribute("aria-pressed", h === head ? "true" : "false"); });
    var cell = Math.max(14, Math.min(28, Math.floor(560 / n)));
    var fontSize = Math.min(12, cell - 2) + "px";
    var canvas = el("canvas", {tabindex: 0, "class": "itv-matrix-canvas",
      "aria-label": heads[head] + " pattern, rows query_pos, columns key_pos: arrow keys move between cells"});
    drawPattern(canvas, pattern[head], cell);
    var cursor = el("div", {"class": "itv-cursor", hidden: true});
    var columnLabels = el("div", {"class": "itv-col-labels"});
    var rowLabels = el("div", {"class": "itv-row-labels"});
    tokens.forEach(function (token, pos) {
      var label = lib.tokenLabel(token), full = "pos " + pos + " " + lib.quote(token);
      var column = el("div", {title: full, text: label});
      column.style.width = cell + "px"; column.style.fontSize = fontSize;
      columnLabels.appendChild(column);
      var row = el("div", {title: full, text: label});
      row.style.height = row.style.lineHeight = cell + "px"; row.style.fontSize = fontSize;
      rowLabels.appendChild(row);
    });
    var status = lib.status();
    var matrix = el("div", {"class": "itv-matrix"}, [
      el("div", {"class": "itv-axis-note", text: "query_pos \u2193  key_pos \u2192"}), columnLabels,
      rowLabels, el("div", {"class": "itv-canvas-wrap"}, [canvas, cursor])
    ]);
    var at = {q: n - 1, k: 0};

    function show(q, k) {
      at = {q: q, k: k};
      var value = pattern[head][q][k];
      var text = "query " + lib.describeToken(tokens, q) + " \u2192 key " + lib.describeToken(tokens, k) + ": " + value;
      status.textContent = text;
      canvas.title = text;
      cursor.hidden = false;
      cursor.style.left = k * cell + "px"; cursor.style.top = q * cell + "px";
      cursor.style.width = cursor.style.height = cell + "px";
      panel.setAttribute("data-query", q); panel.setAttribute("data-key", k); panel.setAttribute("data-value", value);
    }
    canvas.addEventListener("mousemove", function (event) {
      var box = canvas.getBoundingClientRect();
      var k = Math.floor((event.clientX - box.left) / box.width * n), q = Math.floor((event.clientY - box.top) / box.height * n);
      if (q >= 0 && q < n && k >= 0 && k < n) show(q, k);
    });
    canvas.addEventListener("focus", function () { show(at.q, at.k); });
    canvas.addEventListener("keydown", function (event) {
      var moves = {ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1]};
      if (!(event.key in moves)) return;
      event.preventDefault();
      show(Math.max(0, Math.min(n - 1, at.q + moves[event.key][0])), Math.max(0, Math.min(n - 1, at.k + moves[event.key][1])));
    });

    var scroll = el("div", {"class": "itv-scroll"}, [matrix]);
    panel.replaceChildren(el("div", {"class": "itv-enlarged-title", text: heads[head] + ": rows query_pos, columns key_pos"}),
                          scroll, status);
    ["data-query", "data-key", "data-value"].forEach(function (name) { panel.removeAttribute(name); });
    status.textContent = "Hover the pattern, or focus it and use the arrow keys, for values.";
    panel.hidden = false;
    panel.setAttribute("data-head", head);
    root.setAttribute("data-enlarged", head);
    hint.hidden = true;
  }

  root.appendChild(thumbs);
  root.appendChild(lib.legend(scale, "attention weight"));
  root.appendChild(hint);
  root.appendChild(panel);
};
