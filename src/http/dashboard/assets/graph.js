// The graph view: draws #graph-data (nodes and edges, JSON the server escaped) with the
// vendored Cytoscape.js, one style per relation so derived_from / similar_to / supersedes /
// contradicts read apart; a node opens its memory's page (click, or Enter when focused
// through the table below, which lists the same edges for keyboards and screen readers).
import cytoscape from "/ui/assets/cytoscape.esm.min.mjs";

const data = JSON.parse(document.getElementById("graph-data").textContent);
const container = document.getElementById("graph");

const TIER_COLOURS = { episodic: "#7a8591", condensed: "#1f5fbf", knowledge: "#1e7b3a" };
const RELATIONS = {
  derived_from: { color: "#7a8591", style: "solid", arrow: "triangle" },
  similar_to: { color: "#1f5fbf", style: "dotted", arrow: "none" },
  supersedes: { color: "#d97706", style: "solid", arrow: "triangle" },
  contradicts: { color: "#b3261e", style: "dashed", arrow: "tee" },
};

const elements = [
  ...data.nodes.map((n) => ({ data: { id: n.id, label: n.label, tier: n.tier, status: n.status, focus: n.id === data.around } })),
  ...data.edges.map((e, i) => ({ data: { id: `e${i}`, source: e.from, target: e.to, relation: e.relation } })),
];

const style = [
  {
    selector: "node",
    style: {
      "background-color": (n) => TIER_COLOURS[n.data("tier")] || "#7a8591",
      label: "data(label)",
      "font-size": 10,
      "text-wrap": "ellipsis",
      "text-max-width": 120,
      "text-valign": "bottom",
      "text-margin-y": 4,
      width: 18,
      height: 18,
    },
  },
  { selector: "node[?focus]", style: { "border-width": 4, "border-color": "#f0a500", width: 26, height: 26 } },
  { selector: 'node[status = "wrong"], node[status = "obsolete"], node[status = "archived"]', style: { opacity: 0.55 } },
  ...Object.entries(RELATIONS).map(([relation, s]) => ({
    selector: `edge[relation = "${relation}"]`,
    style: {
      "line-color": s.color,
      "line-style": s.style,
      "target-arrow-color": s.color,
      "target-arrow-shape": s.arrow,
      "curve-style": "bezier",
      width: 2,
    },
  })),
];

if (container && data.nodes.length > 0) {
  const cy = cytoscape({
    container,
    elements,
    style,
    layout: { name: data.nodes.length > 1 ? "cose" : "grid", animate: false, randomize: false },
    wheelSensitivity: 0.3,
    // A small graph fitted to the box would be drawn huge.
    maxZoom: 1.5,
    minZoom: 0.1,
  });
  cy.on("tap", "node", (event) => {
    location.href = `/ui/memories/${encodeURIComponent(event.target.id())}`;
  });
  container.dataset.drawn = String(cy.nodes().length);
} else if (container) {
  container.dataset.drawn = "0";
  container.textContent = "Nothing to draw.";
}
