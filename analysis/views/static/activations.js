// activation_view: the text coloured by one column of values (a neuron, a feature...),
// a menu of columns, each token's value in its tooltip and in a status line.
lib.kinds.activations = function (root, data) {
  var tokens = data.tokens, columns = data.columns, names = data.names, scales = data.scales;
  var state = {column: data.initialColumn, preview: null, pinned: null};

  var controls = el("div", {"class": "itv-controls"});
  if (names.length > 1) {
    controls.appendChild(lib.select(root, "Show", names, state.column, function (column) { state.column = column; render(); }).element);
  } else {
    controls.appendChild(el("span", {"class": "itv-field", text: names[0]}));
  }
  var text = lib.tokenRow(tokens, {
    interactive: true,
    label: "tokens: hover or focus one to read its value, click, Enter or Space to keep it in the line below",
    onPreview: function (pos) { state.preview = pos; render(); },
    onSelect: function (pos) { state.pinned = state.pinned === pos ? null : pos; render(); }
  });
  var status = lib.status();
  var legendSlot = el("div");

  function render() {
    var column = state.column, values = columns[column], name = names[column];
    text.spans.forEach(function (span, pos) {
      lib.paint(span, values[pos], scales[column]);
      span.title = "pos " + pos + " " + lib.quote(tokens[pos]) + ": " + name + " = " + values[pos];
    });
    text.markSelected(state.pinned);
    var shown = state.preview !== null ? state.preview : state.pinned;
    text.spans.forEach(function (span, pos) { span.classList.toggle("itv-active", pos === shown); });
    if (shown === null) {
      var top = 0;
      values.forEach(function (value, pos) { if (Math.abs(value) > Math.abs(values[top])) top = pos; });
      status.textContent = name + ": largest magnitude at " + lib.describeToken(tokens, top) + ", " + values[top] +
        ". Hover or focus a token for its value.";
    } else {
      status.textContent = lib.describeToken(tokens, shown) + ": " + name + " = " + values[shown];
    }
    legendSlot.replaceChildren(lib.legend(scales[column], name));
    root.setAttribute("data-column", column);
  }

  root.appendChild(controls);
  root.appendChild(text.element);
  root.appendChild(status);
  root.appendChild(legendSlot);
  render();
};
