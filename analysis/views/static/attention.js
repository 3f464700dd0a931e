// attention_view: the text, coloured by one head's attention from (row) or to (column)
// the active token; a head menu; an "all heads" mode with one small copy of the text per head.
lib.kinds.attention = function (root, data) {
  var tokens = data.tokens, pattern = data.pattern, heads = data.heads, scale = data.scale;
  var state = {head: data.initialHead, token: data.initialToken, preview: null, direction: "from", allHeads: false};

  function active() { return state.preview === null ? state.token : state.preview; }
  // pattern[head][query_pos][key_pos]: "from" reads the active token's row, "to" its column.
  function weight(head, pos) {
    return state.direction === "from" ? pattern[head][active()][pos] : pattern[head][pos][active()];
  }
  function paintText(spans, head) {
    var a = active();
    spans.forEach(function (span, pos) {
      var value = weight(head, pos);
      lib.paint(span, value, scale);
      span.classList.toggle("itv-active", pos === a);
      span.title = "pos " + pos + " " + lib.quote(tokens[pos]) + ": " + value +
        (state.direction === "from" ? " (attention from pos " + a + ")" : " (attention to pos " + a + ")");
    });
  }

  var headMenu = lib.select(root, "Head", heads, state.head, function (head) { state.head = head; render(); });

  var directionName = lib.uniqueId(root, "direction");
  var directions = el("fieldset", {"class": "itv-field itv-radios"}, [el("legend", {text: "Colour by attention"})]);
  [["from", "from the token (its row)"], ["to", "to the token (its column)"]].forEach(function (choice) {
    var id = lib.uniqueId(root, "direction-" + choice[0]);
    var input = el("input", {type: "radio", name: directionName, id: id, value: choice[0], checked: choice[0] === "from"});
    input.addEventListener("change", function () { if (input.checked) { state.direction = choice[0]; render(); } });
    directions.appendChild(el("span", {}, [input, el("label", {"for": id, text: choice[1]})]));
  });

  var allId = lib.uniqueId(root, "all-heads");
  var allBox = el("input", {type: "checkbox", id: allId});
  allBox.addEventListener("change", function () { state.allHeads = allBox.checked; render(); });

  var controls = el("div", {"class": "itv-controls"}, [
    headMenu.element, directions, el("span", {"class": "itv-field"}, [allBox, el("label", {"for": allId, text: "all heads"})])
  ]);
  var text = lib.tokenRow(tokens, {
    interactive: true,
    focusPos: state.token,
    label: "tokens: hover or focus one to preview its attention, click, Enter or Space to keep it",
    onPreview: function (pos) { state.preview = pos; render(); },
    onSelect: function (pos) { state.token = pos; state.preview = null; render(); }
  });
  var status = lib.status();
  var multiples = el("div", {"class": "itv-multiples", hidden: true});
  var cards = null;

  function buildCards() {
    cards = heads.map(function (name, head) {
      var button = el("button", {type: "button", "class": "itv-card-title", text: name, title: "show " + name + " above"});
      button.addEventListener("click", function () { state.head = head; headMenu.select.value = String(head); render(); });
      var copy = lib.tokenRow(tokens);
      var card = el("div", {"class": "itv-card", "data-head": head}, [button, copy.element]);
      multiples.appendChild(card);
      return {card: card, spans: copy.spans};
    });
  }

  function render() {
    var a = active();
    paintText(text.spans, state.head);
    text.markSelected(state.token);
    multiples.hidden = !state.allHeads;
    if (state.allHeads) {
      if (!cards) buildCards();
      cards.forEach(function (entry, head) {
        paintText(entry.spans, head);
        entry.card.classList.toggle("itv-current", head === state.head);
      });
    }
    var best = 0;
    tokens.forEach(function (_, pos) { if (weight(state.head, pos) > weight(state.head, best)) best = pos; });
    status.textContent = heads[state.head] + ": attention " + (state.direction === "from"
      ? "from " + lib.describeToken(tokens, a) + " to each token; it attends most to "
      : "to " + lib.describeToken(tokens, a) + " from each token; most from ") +
      lib.describeToken(tokens, best) + ", " + weight(state.head, best) + ".";
    root.setAttribute("data-head", state.head);
    root.setAttribute("data-token", a);
    root.setAttribute("data-direction", state.direction);
  }

  root.appendChild(controls);
  root.appendChild(text.element);
  root.appendChild(status);
  root.appendChild(lib.legend(scale, "attention weight"));
  root.appendChild(multiples);
  render();
};
